"""gRPC server metrics by the names of Prometheus' gRPC middlewares (go-grpc-prometheus):
`grpc_server_started_total`, `grpc_server_handled_total` and `grpc_server_handling_seconds`, for every
method of every service served, labelled `grpc_service`, `grpc_method`, `grpc_type` and (handled)
`grpc_code` (the Go names: `OK`, `InvalidArgument`, `DeadlineExceeded`, ...).

`CallMetrics` holds the other interceptors' changes to a served method (`serve`: BoundedReads', and
caller authentication's guard when it is on: app/api/auth_grpc.py),
so that a method is labelled by the type its service declares (a unary method stays `unary` when it is
served as a streaming-request one, to read its message under a slot), and a call is counted with the
code it ended with, whoever ended it: the handler, an abort, the read bound, the caller's cancel. A
method nobody serves is answered UNIMPLEMENTED by grpc before any interceptor's handler runs, so it is
not counted: its name is the caller's, and no label holds what a caller chose.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from app.core.metrics import (
    grpc_server_handled_total,
    grpc_server_handling_seconds,
    grpc_server_started_total,
)

if TYPE_CHECKING:  # generic in grpc-stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler, Context = grpc.RpcMethodHandler, grpc.aio.ServicerContext
    Interceptor = grpc.aio.ServerInterceptor
# grpc.StatusCode -> its name in Go's codes package, as the middlewares label it.
GO_NAMES = {
    code: {"OK": "OK", "CANCELLED": "Canceled"}.get(
        code.name, "".join(part.capitalize() for part in code.name.split("_"))
    )
    for code in grpc.StatusCode
}
RPC_TYPES = {
    (False, False): "unary",
    (True, False): "client_stream",
    (False, True): "server_stream",
    (True, True): "bidi_stream",
}


class Labels(NamedTuple):
    service: str
    method: str
    rpc_type: str


class _Series:
    """One method's series, looked up once."""

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.started = grpc_server_started_total.labels(*labels)
        self.seconds = grpc_server_handling_seconds.labels(*labels)
        self.handled: dict[grpc.StatusCode, Any] = {}

    def ended(self, code: grpc.StatusCode, started: float) -> None:
        self.seconds.observe(time.perf_counter() - started)
        counter = self.handled.get(code)
        if counter is None:
            counter = self.handled[code] = grpc_server_handled_total.labels(*self.labels, GO_NAMES[code])
        counter.inc()


def _labels(full_method: str, handler: Handler) -> Labels:
    service, _, method = full_method.lstrip("/").rpartition("/")
    return Labels(service, method, RPC_TYPES[(handler.request_streaming, handler.response_streaming)])


def _code(context: Context, error: BaseException | None) -> grpc.StatusCode:
    """The code a call ends with: what the handler set or aborted with, UNKNOWN for what it raised
    (grpc answers that), CANCELLED or DEADLINE_EXCEEDED for a call the caller gave up on."""
    if isinstance(error, asyncio.CancelledError):
        remaining = context.time_remaining()
        late = remaining is not None and remaining <= 0
        return grpc.StatusCode.DEADLINE_EXCEEDED if late else grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.OK


def _timed(behavior: Any, series: _Series) -> Callable[[Any, Context], Awaitable[Any]]:
    """`behavior` counted and timed under `series`."""
    run = _writing_replies(behavior) if inspect.isasyncgenfunction(behavior) else behavior

    async def timed(request: Any, context: Context) -> Any:
        started, error = _start(series), None
        try:
            return await run(request, context)
        except BaseException as raised:
            error = raised
            raise
        finally:
            series.ended(_code(context, error), started)

    return timed


def _writing_replies(behavior: Any) -> Callable[[Any, Context], Awaitable[None]]:
    """A behavior that yields its replies, as one that writes them: its end is the call's."""

    async def write(request: Any, context: Context) -> None:
        async for reply in behavior(request, context):
            await context.write(reply)

    return write


def _start(series: _Series) -> float:
    series.started.inc()
    return time.perf_counter()


def _observed(handler: Handler, series: _Series) -> Handler:
    """`handler` with its behavior counted and timed under `series`."""
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_timed(handler.stream_stream, series), **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_timed(handler.stream_unary, series), **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_timed(handler.unary_stream, series), **codec)
    return grpc.unary_unary_rpc_method_handler(_timed(handler.unary_unary, series), **codec)


class CallMetrics(Interceptor):
    """Counts and times every call of a served method; `serve` is how the server serves a method's
    handler (its other interceptors' changes, given the method's path), applied inside the counting."""

    def __init__(self, serve: Callable[[str, Handler], Handler] = lambda method, handler: handler) -> None:
        self.serve = serve
        self._series: dict[str, _Series] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        series = self._series.get(method)
        if series is None:
            series = self._series[method] = _Series(_labels(method, handler))
        return _observed(self.serve(method, handler), series)
