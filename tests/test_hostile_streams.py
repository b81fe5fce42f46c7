"""What a caller who starts requests and never finishes them may cost (docs/callers.md, "Connections
and streams"): a request arrives complete within the request timeout or its stream is reset; a gRPC
connection carries at most 100 streams, is closed when idle and goes away when old; and the memory
all unfinished requests hold is bounded, while a well-behaved caller is answered meanwhile.

The hostile callers speak HTTP/2 and HTTP/1.1 themselves (tests/support/hostile_h2.py); the API is
the real one, in this process or, where its memory is measured, as `xmtp-push dev` in a child.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.api.grpc_bounds import TOO_SLOW, ConnectionLimits
from app.api.grpc_server import start_grpc_server
from app.proto.xmtp.backend.v1 import notification_pb2, notification_pb2_grpc
from app.runtime import open_runtime
from tests.support import Api, eventually, make_settings, running
from tests.support.hostile_h2 import MIB, stalled_grpc_calls, stalled_http_bodies
from tests.support.ops import free_port
from tests.support.process import Child, child, clean_env

REGISTER = "/xmtp.backend.v1.NotificationService/Register"
DEADLINE_EXCEEDED = str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 3, 4


def register_request() -> notification_pb2.RegisterRequest:
    return notification_pb2.RegisterRequest(
        recipient_id=secrets.token_bytes(32),
        recipient_secret=secrets.token_bytes(32),
        http=notification_pb2.HttpDelivery(
            url="http://127.0.0.1:9/hooks", signing_key=secrets.token_bytes(32)
        ),
    )


@pytest.fixture
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    async with running(make_settings(sqlite_url, request_timeout_seconds=1.0)) as started:
        yield started


async def test_health_check_and_watch_are_answered_through_the_bounded_reads(api: Api) -> None:
    health = health_pb2_grpc.HealthStub(api.grpc_channel)
    answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(service="xmtp.backend.v1.NotificationService"))
    first = await asyncio.wait_for(anext(aiter(watch)), 10)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_the_server_offers_100_streams_and_a_64_kib_window_per_stream(api: Api) -> None:
    async with stalled_grpc_calls(api.grpc_port, REGISTER, connections=1, streams=1) as [connection]:
        await eventually(
            lambda: SETTINGS_MAX_CONCURRENT_STREAMS in connection.server_settings, 10, "the server's answer"
        )
    assert connection.server_settings[SETTINGS_MAX_CONCURRENT_STREAMS] == 100
    # With grpc's bandwidth probe on, a stream's first window grows to megabytes before any read.
    assert connection.server_settings.get(SETTINGS_INITIAL_WINDOW_SIZE, 65535) <= 64 * 1024


@pytest.mark.slow
async def test_a_message_that_never_completes_is_reset_at_the_request_timeout(api: Api) -> None:
    async with stalled_grpc_calls(api.grpc_port, REGISTER, connections=2, streams=3) as connections:
        # A well-behaved caller meanwhile, on a connection of its own.
        started = time.monotonic()
        await api.stub.Register(register_request(), timeout=10)
        assert time.monotonic() - started < 5
        await eventually(lambda: all(len(c.ends) == 3 for c in connections), 15, "the server's answer")
    ends = [end for connection in connections for end in connection.ends.values()]
    assert {(end.status, end.message) for end in ends} == {(DEADLINE_EXCEEDED, TOO_SLOW)}
    # The request timeout is 1 s; a loaded machine may answer late, never early.
    assert all(1.0 <= end.seconds < 10 for end in ends), [end.seconds for end in ends]


@pytest.mark.slow
async def test_an_idle_connection_is_closed_and_an_old_one_goes_away_after_its_grace(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, request_timeout_seconds=30.0)
    limits = ConnectionLimits(idle_seconds=1.0, age_seconds=2.0, grace_seconds=1.0)
    async with open_runtime(settings) as runtime:
        server, port = await start_grpc_server(runtime, "127.0.0.1", 0, limits=limits)
        try:
            async with (
                stalled_grpc_calls(port, REGISTER, connections=1, streams=0) as [idle],
                stalled_grpc_calls(port, REGISTER, connections=1, streams=1) as [busy],
            ):
                await eventually(
                    lambda: idle.goaway is not None and busy.closed is not None, 20, "the server's answer"
                )
        finally:
            await server.stop(0)
    # grpc counts from the connection's accept, a little before the client's clock starts.
    assert idle.goaway is not None and 0.5 <= idle.goaway < 10, idle.goaway
    # The busy one is not idle: it goes away at its age, and is cut once the grace has passed.
    assert busy.goaway is not None and 1.5 <= busy.goaway < 10, busy.goaway
    assert busy.closed is not None and busy.closed - busy.goaway >= 0.5, (busy.goaway, busy.closed)


# ---- memory: the API as its own process --------------------------------------------------------------


class Ports(NamedTuple):
    http: int
    grpc: int


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextlib.asynccontextmanager
async def api_process(tmp_path: Path) -> AsyncIterator[tuple[Child, int, int]]:
    http_port, grpc_port = free_port(), free_port()
    env = clean_env(
        XMTP_PUSH_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'push.db'}",
        XMTP_PUSH_HTTP_PORT=str(http_port),
        XMTP_PUSH_GRPC_PORT=str(grpc_port),
        XMTP_PUSH_METRICS_PORT="0",
        XMTP_PUSH_WEBHOOK_ENABLED="true",
        XMTP_PUSH_WEBHOOK_ALLOW_INSECURE="true",
        XMTP_PUSH_WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true",
    )
    async with child("dev", ["dev"], env) as process:
        async with httpx.AsyncClient(timeout=2) as client:
            await eventually(lambda: ready(client, http_port), 60, "the API to be ready")
        yield process, http_port, grpc_port
        await process.stop()


async def ready(client: httpx.AsyncClient, port: int) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    return False


async def peak_rss_while(pid: int, seconds: float, calls: AsyncIterator[float]) -> tuple[int, list[float]]:
    """The largest RSS over `seconds`, sampled every 50 ms, and the latencies of `calls` meanwhile."""
    peak, latencies = rss_bytes(pid), []
    deadline = time.monotonic() + seconds

    async def sample() -> None:
        nonlocal peak
        while time.monotonic() < deadline:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    async def call() -> None:
        async for latency in calls:
            latencies.append(latency)
            if time.monotonic() >= deadline:
                return

    await asyncio.gather(sample(), call())
    return peak, latencies


async def timed_registers(grpc_port: int) -> AsyncIterator[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = notification_pb2_grpc.NotificationServiceStub(channel)
        while True:
            started = time.monotonic()
            await stub.Register(register_request(), timeout=30)
            yield time.monotonic() - started
            await asyncio.sleep(0.25)


async def timed_connect_registers(http_port: int) -> AsyncIterator[float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as client:
        while True:
            started = time.monotonic()
            answer = await client.post(
                REGISTER,
                content=register_request().SerializeToString(),
                headers={"content-type": "application/proto"},
            )
            assert answer.status_code == 200, answer.text
            yield time.monotonic() - started
            await asyncio.sleep(0.25)


def check_bounded(before: int, peak: int, latencies: list[float], sent: int) -> None:
    growth = (peak - before) / MIB
    print(
        f"RSS {before / MIB:.0f} MiB -> peak {peak / MIB:.0f} MiB (+{growth:.0f} MiB); body bytes sent "
        f"{sent / MIB:.0f} MiB; well-behaved Register: {len(latencies)} calls, median "
        f"{statistics.median(latencies) * 1000:.0f} ms, slowest {max(latencies) * 1000:.0f} ms"
    )
    assert growth < 256, f"RSS grew by {growth:.0f} MiB"
    # The contract's 1 s, on the median: a loaded machine may pause one call; a caller starved of
    # read slots would wait out the 30 s request timeout on every call.
    assert statistics.median(latencies) < 1.0, latencies
    assert max(latencies) < 10.0, latencies


async def attacked(
    tmp_path: Path,
    calls: Callable[[Ports], AsyncIterator[float]],
    attack: Callable[[Ports], contextlib.AbstractAsyncContextManager[Any]],
    sent_of: Callable[[Any], int],
    least_sent: int,
) -> None:
    """Under `attack` for 10 s, the API's RSS grows by less than 256 MiB while `calls` are answered."""
    async with api_process(tmp_path) as (process, http_port, grpc_port):
        ports, pid = Ports(http_port, grpc_port), process.process.pid
        assert pid is not None
        async for _ in calls(ports):
            break  # a first call, so that what it costs once is in the baseline
        before = rss_bytes(pid)
        async with attack(ports) as attackers:
            peak, latencies = await peak_rss_while(pid, 10.0, calls(ports))
            sent = sent_of(attackers)
    check_bounded(before, peak, latencies, sent)
    assert sent >= least_sent, f"the attack sent only {sent} bytes"  # every stream its first window


@pytest.mark.slow
async def test_500_stalled_grpc_streams_hold_less_than_256_mib_and_a_register_is_answered(
    tmp_path: Path,
) -> None:
    await attacked(
        tmp_path,
        lambda ports: timed_registers(ports.grpc),
        lambda ports: stalled_grpc_calls(ports.grpc, REGISTER, connections=10, streams=50),
        lambda connections: sum(c.body_bytes_sent for c in connections),
        500 * 60 * 1024,
    )


@pytest.mark.slow
async def test_200_stalled_connect_bodies_hold_less_than_256_mib_and_a_register_is_answered(
    tmp_path: Path,
) -> None:
    await attacked(
        tmp_path,
        lambda ports: timed_connect_registers(ports.http),
        lambda ports: stalled_http_bodies(ports.http, REGISTER, connections=200),
        sum,
        200 * 64 * 1024,
    )
