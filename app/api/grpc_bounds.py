"""What an unfinished gRPC request may cost: the server's options and the read of each request.

grpcio (held to 1.85.x in pyproject.toml) bounds neither the time a request's message may take to
arrive nor the memory of messages that never finish: the transport opens a stream's window to the
whole message its prefix declares as soon as the handler reads, and with its bandwidth probe on it
advertises windows of many megabytes before any read. Every adjustment of it lives here:

- the probe is off, so a stream holds at most the initial window (64 KiB) until its message is read;
- an interceptor (`BoundedReads`, whose `serve` the metrics' interceptor applies: app/api/grpc_metrics.py),
  which runs when a call's headers arrive, serves each unary-request method as a
  streaming-request one, so that its message is read here: under a read slot (`ReadSlots`), and within
  the request timeout of the headers, or the call ends DEADLINE_EXCEEDED and its stream is reset;
- streams per connection, idle connections and a connection's age are bounded by grpc's own options.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from app.api.read_slots import ReadSlots

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TOO_SLOW = "request did not arrive in time"
NO_MESSAGE = "request is malformed"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How much of the server one connection may take, and for how long."""

    streams: int = 100
    idle_seconds: float = 300.0
    age_seconds: float = 1800.0
    grace_seconds: float = 30.0  # a connection past its age finishes its calls within this


CONNECTION_LIMITS = ConnectionLimits()


# With caller authentication on, a call's metadata may hold an 8192-byte bearer token beside its other
# headers: grpcio's default limit (8 KiB) would refuse it before the check could say `malformed`.
AUTH_METADATA_BYTES = 32 * 1024


def server_options(limits: ConnectionLimits, *, metadata_bytes: int | None = None) -> list[tuple[str, Any]]:
    # Both the soft limit (above which grpc refuses some calls at random) and the hard one.
    metadata = [
        ("grpc.max_metadata_size", metadata_bytes),
        ("grpc.absolute_max_metadata_size", metadata_bytes),
    ]
    return (metadata if metadata_bytes else []) + [
        # No message of this API comes near 4 MiB (1000 adds of 17..33-byte topics with three 42-byte
        # keys each is about 170 KiB).
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        # grpcio sets SO_REUSEPORT by default: a second server on the same port would start too, and
        # the kernel would split the calls between the two. A taken port must stop start-up instead.
        ("grpc.so_reuseport", 0),
        # With the probe on, the advertised windows grow to hundreds of MiB: 500 streams that never
        # finish took 2 GB. Off, the first window is 64 KiB; a 4 MB message still arrives in tens of ms.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.max_concurrent_streams", limits.streams),
        ("grpc.max_connection_idle_ms", int(limits.idle_seconds * 1000)),
        ("grpc.max_connection_age_ms", int(limits.age_seconds * 1000)),
        ("grpc.max_connection_age_grace_ms", int(limits.grace_seconds * 1000)),
    ]


Context = grpc.aio.ServicerContext[Any, Any]


async def _one_message(
    requests: AsyncIterator[Any], context: Context, slots: ReadSlots, seconds: float
) -> Any:
    """The call's one request message, read under a slot and within `seconds` of the call's start
    (the wait for a slot counts), or the call ends. What follows the first message is not read: a
    unary call sends one."""
    try:
        async with asyncio.timeout(seconds), slots.slot(context.peer()):
            message = await anext(aiter(requests), None)
    except TimeoutError:
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, TOO_SLOW)
    if message is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NO_MESSAGE)
    return message


# A handler's behaviors are Any: grpc-stubs types them as the synchronous API's.
def _unary_unary(
    behavior: Any, slots: ReadSlots, seconds: float
) -> Callable[[AsyncIterator[Any], Context], Awaitable[Any]]:
    async def read_then_call(requests: AsyncIterator[Any], context: Context) -> Any:
        return await behavior(await _one_message(requests, context, slots, seconds), context)

    return read_then_call


def _unary_stream(
    behavior: Any, slots: ReadSlots, seconds: float
) -> Callable[[AsyncIterator[Any], Context], Awaitable[None]]:
    async def read_then_stream(requests: AsyncIterator[Any], context: Context) -> None:
        replies = behavior(await _one_message(requests, context, slots, seconds), context)
        if inspect.isasyncgen(replies):  # a generator of replies, or a coroutine writing them itself
            async for reply in replies:
                await context.write(reply)
        else:
            await replies

    return read_then_stream


if TYPE_CHECKING:
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # generic in grpc-stubs only
    Interceptor = grpc.aio.ServerInterceptor


class BoundedReads(Interceptor):
    """Serves every unary-request method so that its message is read under a slot and in time."""

    def __init__(self, slots: ReadSlots, seconds: float) -> None:
        self.slots, self.seconds = slots, seconds

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        return self.serve(await continuation(handler_call_details))

    def serve(self, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler that serves a method as `handler` would, its message read under the bounds."""
        if handler is None or handler.request_streaming:
            return handler
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                _unary_stream(handler.unary_stream, self.slots, self.seconds),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_unary_rpc_method_handler(
            _unary_unary(handler.unary_unary, self.slots, self.seconds),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
