"""The gRPC server's metrics (docs/operations.md#metrics), by the names of Prometheus' gRPC middlewares:
real calls over a real port to both services served, each counted with the code it ended with and the
type its service declares, whoever ended it (the handler, an abort, the read bound, the caller)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from app.api.grpc_bounds import TOO_SLOW
from app.api.grpc_server import start_grpc_server
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.runtime import open_runtime
from tests.support import eventually, make_settings
from tests.support.builders import new_creds
from tests.support.builders import register as registration

pytestmark = pytest.mark.slow

API = "xmtp.backend.v1.NotificationService"
HEALTH = "grpc.health.v1.Health"
READ_SECONDS = 0.5  # the request timeout: a message not read by then ends the call


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def handled(service: str, method: str, rpc_type: str, code: str) -> float:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": rpc_type}
    return sample("grpc_server_handled_total", **labels, grpc_code=code)


def every_sample(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == name
    }


async def never_sends() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""  # pragma: no cover


async def test_every_call_is_counted_by_service_method_type_and_code(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, request_timeout_seconds=READ_SECONDS)
    async with open_runtime(settings, sends=False) as runtime:
        server, port = await start_grpc_server(runtime, "127.0.0.1", 0)
        before_handled = every_sample("grpc_server_handled_total")
        expected: dict[tuple[str, str, str, str], float] = {}

        def expect(service: str, method: str, rpc_type: str, code: str) -> None:
            key = (service, method, rpc_type, code)
            expected[key] = expected.get(key, handled(*key)) + 1

        register = {"grpc_service": API, "grpc_method": "Register", "grpc_type": "unary"}
        started_before = sample("grpc_server_started_total", **register)
        timed_before = sample("grpc_server_handling_seconds_count", **register)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                api = notification_pb2_grpc.NotificationServiceStub(channel)
                health = health_pb2_grpc.HealthStub(channel)
                raw = channel.unary_unary(f"/{API}/Register")

                expect(API, "Register", "unary", "OK")
                await api.Register(registration(new_creds()), timeout=10)

                expect(API, "Register", "unary", "InvalidArgument")  # the handler aborts
                with pytest.raises(grpc.aio.AioRpcError) as malformed:
                    await raw(b"\xff\xff", timeout=10)
                assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT

                expect(API, "Register", "unary", "DeadlineExceeded")  # the read bound ends it
                slow = channel.stream_unary(f"/{API}/Register")
                with pytest.raises(grpc.aio.AioRpcError) as late:
                    await slow(never_sends(), timeout=10)
                assert (late.value.code(), late.value.details()) == (
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    TOO_SLOW,
                )

                unknown = channel.unary_unary(f"/{API}/NoSuchMethod")
                with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
                    await unknown(b"", timeout=10)
                assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED

                expect(HEALTH, "Check", "unary", "OK")
                answer = await health.Check(health_pb2.HealthCheckRequest(service=API), timeout=10)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
                expect(HEALTH, "Check", "unary", "NotFound")
                with pytest.raises(grpc.aio.AioRpcError) as not_found:
                    await health.Check(health_pb2.HealthCheckRequest(service="nobody"), timeout=10)
                assert not_found.value.code() == grpc.StatusCode.NOT_FOUND

                expect(HEALTH, "Watch", "server_stream", "Canceled")  # the caller leaves
                watch = health.Watch(health_pb2.HealthCheckRequest(service=API))
                first = await anext(aiter(watch))
                assert first.status == health_pb2.HealthCheckResponse.SERVING
                watch.cancel()

                await eventually(
                    lambda: all(handled(*key) == count for key, count in expected.items()),
                    timeout=10,
                    what="every call counted",
                )
        finally:
            await server.stop(None)

    # Each call once, under its own labels, and nothing else: no series names the unknown method.
    after_handled = every_sample("grpc_server_handled_total")
    changed = {key: value for key, value in after_handled.items() if before_handled.get(key) != value}
    assert len(changed) == len(expected), changed
    for (service, method, rpc_type, code), count in expected.items():
        assert handled(service, method, rpc_type, code) == count, (method, code)
    assert sample("grpc_server_started_total", **register) == started_before + 3
    assert sample("grpc_server_handling_seconds_count", **register) == timed_before + 3
    assert not any("NoSuchMethod" in str(key) for key in after_handled)
