"""The gRPC transport: NotificationService and grpc.health.v1 on their own port.

Requests are taken as raw bytes and decoded here, so a body that does not
decode is answered INVALID_ARGUMENT "request is malformed" as the SDK expects,
rather than grpc's generic INTERNAL for a failed deserializer.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from app.api.auth_grpc import GrpcAuth
from app.api.call_quota import grpc_quota
from app.api.calls import METHODS, SERVICE_NAME, Method, invoke
from app.api.error_details import grpc_trailers
from app.api.grpc_bounds import (
    AUTH_METADATA_BYTES,
    CONNECTION_LIMITS,
    BoundedReads,
    ConnectionLimits,
    server_options,
)
from app.api.grpc_metrics import CallMetrics
from app.api.grpc_metrics import Handler as MethodHandler
from app.api.legacy_calls import LEGACY_METHODS, LEGACY_SERVICE_NAME
from app.api.read_slots import ReadSlots
from app.auth.caller_auth import CallerAuth
from app.core.errors import Code, DomainError
from app.quotas.quotas import Quotas
from app.runtime import Runtime

STATUS = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
}


class PortUnavailable(OSError):
    """The gRPC address is taken or cannot be bound: start-up stops."""


Handler = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Coroutine[Any, Any, bytes]]


def _handler(runtime: Runtime, method: Method, quotas: Quotas | None) -> Handler:
    trusted = runtime.settings.trusted_proxies

    async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        def decode(message_type: type[Message]) -> Message:
            return message_type.FromString(request)

        try:
            quota = grpc_quota(context, quotas, trusted)
            reply = await invoke(runtime, method, decode, context.time_remaining(), quota)
        except DomainError as error:
            code = STATUS[error.code]
            if error.violation is None:
                await context.abort(code, error.message)
            trailers = grpc_trailers(code, error.message, error.violation)
            await context.abort(code, error.message, trailing_metadata=trailers)
        return reply.SerializeToString()

    return handle


def service_handler(
    runtime: Runtime, service: str, methods: dict[str, Method], quotas: Quotas | None = None
) -> grpc.GenericRpcHandler[Any, Any]:
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(_handler(runtime, method, quotas))
        for name, method in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)


def served_services(runtime: Runtime) -> dict[str, dict[str, Method]]:
    """The services this process answers on its gRPC port; the legacy API only when enabled (an
    UNIMPLEMENTED answer otherwise, as for any service not served)."""
    services = {SERVICE_NAME: METHODS}
    if runtime.settings.legacy_api_enabled:
        services[LEGACY_SERVICE_NAME] = LEGACY_METHODS
    return services


def _in_use(host: str, port: int) -> bool:
    """Whether another socket holds `port` on an address `host` resolves to. Asked first, so that
    a taken port stops start-up with our one line alone: grpcio's own bind failure also prints a
    line of the native library's (`E1204 ... add_port.cc`) on stderr, before any handler of ours."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False  # grpcio says what it makes of the host
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpcio binds
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return True
    return False


async def start_grpc_server(
    runtime: Runtime,
    host: str,
    port: int,
    slots: ReadSlots | None = None,
    limits: ConnectionLimits = CONNECTION_LIMITS,
    caller_auth: CallerAuth | None = None,
    quotas: Quotas | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server and the bound port (useful when port is 0). `slots`: the
    process's read slots, shared with its HTTP server (a set of its own when None); `caller_auth`: the
    process's caller authentication, when on; `quotas`: the process's quotas, when any is on."""
    reads = BoundedReads(slots or ReadSlots(), runtime.settings.request_timeout_seconds)
    guard = GrpcAuth(caller_auth.authenticator) if caller_auth else None

    def serve(method: str, handler: MethodHandler) -> MethodHandler:
        bounded = reads.serve(handler)
        return guard.guarded(method, bounded) if guard else bounded

    # The metrics count each call around the guard and the bounded read (see app/api/grpc_metrics.py);
    # the guard's own interceptor comes first, for a method of the service nobody serves.
    counted = CallMetrics(serve)
    options = server_options(limits, metadata_bytes=AUTH_METADATA_BYTES if guard else None)
    server = grpc.aio.server(options=options, interceptors=[guard, counted] if guard else [counted])
    services = served_services(runtime)
    handlers = tuple(service_handler(runtime, n, m, quotas) for n, m in services.items())
    server.add_generic_rpc_handlers(handlers)
    # grpc-stubs' health module does not declare the `aio` submodule it re-exports.
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if caller_auth is not None and caller_auth.jwks is not None:
        caller_auth.jwks.on_expiry(lambda: _not_serving(health_servicer))
    taken = PortUnavailable(f"gRPC address {host}:{port} is in use or cannot be bound")
    if port and _in_use(host, port):
        raise taken
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio's answer to a taken port when it may not share it
        bound = 0
    if bound == 0:
        raise taken
    await server.start()
    for name in ("", *services):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def _not_serving(health_servicer: Any) -> None:
    """The key set expired: health answers NOT_SERVING while the process stops."""
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
