"""Caller authentication on the gRPC port: every NotificationService call is admitted or refused from
its method path and metadata alone, before its message is read (docs/callers.md#who-may-call).

`GrpcAuth` is the server's first interceptor. A method of the service that it serves is guarded
inside the metrics' counting (`guarded`, applied by CallMetrics around the bounded read), so that a
refused Register is counted as Unauthenticated; a method name of the service that nobody serves is
refused here, before grpc would answer UNIMPLEMENTED (and, as UNIMPLEMENTED is, not counted: its name
is the caller's). grpc.health.v1 and the other services on the port are not covered.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

import grpc

from app.api.calls import METHODS, SERVICE_NAME
from app.api.grpc_metrics import Context, Handler, Interceptor
from app.auth.authenticator import Authenticator, Principal
from app.auth.rejections import Rejection
from app.core.errors import Code

PREFIX = f"/{SERVICE_NAME}/"
AUTHORIZATION = "authorization"
RPC_NAMES = {method.path: name for name, method in METHODS.items()}
# Who the call being served was admitted as, for its quotas (app/api/call_quota.py): set by the guard
# in the call's own task, before the method's handler runs in it.
ADMITTED: ContextVar[Principal | None] = ContextVar("admitted", default=None)
STATUS = {
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def authorization_values(metadata: Sequence[tuple[str, str | bytes]] | None) -> list[bytes]:
    return [
        value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
        for key, value in metadata or ()
        if key.lower() == AUTHORIZATION
    ]


class GrpcAuth(Interceptor):
    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    def _verdict(self, method: str, metadata: Any) -> Rejection | None:
        verdict = self.authenticator.admit(
            authorization_values(metadata), RPC_NAMES.get(method, "an unknown method"), "gRPC"
        )
        if isinstance(verdict, Rejection):
            return verdict
        ADMITTED.set(verdict)
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is not None or not method.startswith(PREFIX):
            return handler
        rejection = self._verdict(method, handler_call_details.invocation_metadata)
        if rejection is None:
            return handler  # admitted: grpc answers UNIMPLEMENTED

        async def refuse(requests: AsyncIterator[Any], context: Context) -> None:
            await _abort(context, rejection)

        return grpc.stream_stream_rpc_method_handler(refuse)

    def guarded(self, method: str, handler: Handler) -> Handler:
        """`handler` (a request-streaming one: the bounded read's) refusing a call before it reads."""
        if handler is None or not method.startswith(PREFIX) or not handler.request_streaming:
            return handler
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._checked(method, handler.stream_stream), **codec
            )
        return grpc.stream_unary_rpc_method_handler(self._checked(method, handler.stream_unary), **codec)

    def _checked(self, method: str, behavior: Any) -> Callable[[Any, Context], Awaitable[Any]]:
        if inspect.isasyncgenfunction(behavior):
            return self._checked_generator(method, behavior)

        async def checked(requests: Any, context: Context) -> Any:
            rejection = self._verdict(method, context.invocation_metadata())
            if rejection is not None:
                await _abort(context, rejection)
            return await behavior(requests, context)

        return checked

    def _checked_generator(self, method: str, behavior: Any) -> Callable[[Any, Context], Awaitable[None]]:
        async def checked(requests: Any, context: Context) -> None:
            rejection = self._verdict(method, context.invocation_metadata())
            if rejection is not None:
                await _abort(context, rejection)
            async for reply in behavior(requests, context):
                await context.write(reply)

        return checked


async def _abort(context: Context, rejection: Rejection) -> None:
    # Before any message or header of ours: grpc sends the status alone (trailers-only).
    await context.abort(STATUS[rejection.code], rejection.message)
