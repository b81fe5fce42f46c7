"""A JWKS that stops answering (docs/callers.md#key-set): XMTP_PUSH_AUTH_JWKS_MAX_STALE_SECONDS after the
last successful fetch, /readyz answers 503 and gRPC health NOT_SERVING, and the process stops and exits
10 with one line naming XMTP_PUSH_AUTH_JWKS_URL; a fetch that succeeds before then saves it."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support import eventually, make_settings, running
from tests.support.auth import jwks_server, signing_key
from tests.support.cli import dev_env
from tests.support.ops import free_port
from tests.support.process import child

pytestmark = pytest.mark.slow
# The shortest the settings allow: refresh 1 s, max stale 1 + 1 + 10 s.
REFRESH, MAX_STALE = 1, 12
SERVICE = "xmtp.backend.v1.NotificationService"


async def test_a_key_set_too_stale_turns_readiness_and_grpc_health_off(sqlite_url: str) -> None:
    with jwks_server(signing_key("ES256")) as server:
        settings = make_settings(
            sqlite_url,
            auth_enabled=True,
            auth_jwks_url=server.url,
            auth_jwks_refresh_seconds=REFRESH,
            auth_jwks_max_stale_seconds=MAX_STALE,
        )
        async with running(settings) as api:
            health = health_pb2_grpc.HealthStub(api.grpc_channel)

            async def serving() -> tuple[int, int, int]:
                readyz = (await api.http.get("/readyz")).status_code
                whole = (await health.Check(health_pb2.HealthCheckRequest())).status
                service = (await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))).status
                return readyz, whole, service

            ok = (200, health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.SERVING)
            assert await serving() == ok
            server.status = 503
            failing_since = time.monotonic()
            await asyncio.sleep(MAX_STALE - 4)
            assert await serving() == ok  # stale, not yet too stale
            off = (
                503,
                health_pb2.HealthCheckResponse.NOT_SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
            await eventually(lambda: _is(serving, off), timeout=10, what="readyz 503 and NOT_SERVING")
            assert time.monotonic() - failing_since >= MAX_STALE - REFRESH * 1.1 - 0.5
            server.status = 200  # too late: a fetch after the deadline does not save it
            await asyncio.sleep(REFRESH * 2.5)
            assert await serving() == off


async def _is(serving: object, wanted: tuple[int, int, int]) -> bool:
    return await serving() == wanted  # type: ignore[operator]


async def test_a_process_whose_key_set_is_too_stale_exits_10(tmp_path: Path) -> None:
    with jwks_server(signing_key("ES256")) as server:
        env = dev_env(
            tmp_path,
            free_port(),
            free_port(),
            XMTP_PUSH_AUTH_ENABLED="true",
            XMTP_PUSH_AUTH_JWKS_URL=server.url,
            XMTP_PUSH_AUTH_JWKS_REFRESH_SECONDS=str(REFRESH),
            XMTP_PUSH_AUTH_JWKS_MAX_STALE_SECONDS=str(MAX_STALE),
        )
        async with child("dev", ["dev"], env) as process:
            await process.line(re.compile("serving http="))
            server.status = 503
            await asyncio.wait_for(process.process.wait(), MAX_STALE + 20)
            assert process.process.returncode == 10, process.output()
            await asyncio.sleep(0.1)
            last = [line for line in process.lines if line.startswith("xmtp-push:")]
            assert last and last[-1].startswith(
                "xmtp-push: XMTP_PUSH_AUTH_JWKS_URL: no key set fetched from 127.0.0.1"
            ), process.output()
