"""A local xmtp-node-go node for the node-go listener: `MessageApi/SubscribeAll` over real gRPC,
scriptable.

`FakeNodeGo` is an in-process `grpc.aio` server on a real port (127.0.0.1, port picked by the OS)
serving `xmtp.message_api.v1.MessageApi/SubscribeAll` (docs/legacy.md#from-envelope-to-push). As
node-go does, a stream sends its headers (`subscribed: true`) as it opens, then each envelope as it is
published, and nothing else: no keep-alive, and no history (node-go keeps no cursor to catch up from).

- `publish(items)` sends each envelope, as one message each, to every open stream; an item is an
  `Envelope` or raw bytes (which need not be an envelope: a malformed one).
- `drop_streams(how)` ends every open stream (`abort`: status UNAVAILABLE, `end`: it finishes with OK);
  `go_away()` stops the server (every connection cut, nothing listening on the port) and `come_back()`
  listens again on the same port; `refuse_streams = True` turns new streams away with UNAVAILABLE.

Builders at the bottom make envelopes as node-go carries them: a v3 group message or welcome, serialized,
on its topic string. Nothing here imports the code under test except the generated protobuf modules.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from app.proto.xmtp.message_api.v1 import message_api_pb2 as api
from app.proto.xmtp.mls.api.v1 import mls_pb2 as mls
from fakes.grpc_node import StreamingNode

SERVICE = "xmtp.message_api.v1.MessageApi"
_Context = grpc.aio.ServicerContext[api.SubscribeAllRequest, bytes]


@dataclass(eq=False)
class _Stream:
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)
    sent: int = 0


class FakeNodeGo(StreamingNode):
    def __init__(self) -> None:
        self._streams: set[_Stream] = set()
        super().__init__(self._streams)
        self.connections = 0  # SubscribeAll calls received (refused ones included)
        self.refuse_streams = False

    # life

    async def start(self, port: int = 0) -> FakeNodeGo:
        """Serve on `port` (0: one the OS picks)."""
        server = grpc.aio.server()
        handler = grpc.unary_stream_rpc_method_handler(
            self._subscribe_all,
            request_deserializer=api.SubscribeAllRequest.FromString,
            response_serializer=lambda raw: raw,  # publish() serializes, or sends bytes as they are
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"SubscribeAll": handler}),)
        )
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        if port and bound != port:
            raise OSError(f"could not listen on port {port}")
        await server.start()
        self._server, self.port = server, bound
        return self

    async def go_away(self) -> None:
        """Stop at once: every connection cut, nothing listening on the port until `come_back()`."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(None)
            self._streams.clear()
            await self._notify()

    async def come_back(self) -> None:
        await self.start(self.port)

    async def __aenter__(self) -> FakeNodeGo:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.go_away()

    # scripting

    def publish(self, items: Sequence[api.Envelope | bytes]) -> int:
        """Send each item, in order, to every open stream; returns how many streams they went to."""
        raws = [item if isinstance(item, bytes) else item.SerializeToString() for item in items]
        for stream in self._streams:
            for raw in raws:
                stream.queue.put_nowait(raw)
        return len(self._streams)

    def drop_streams(self, how: str = "abort") -> int:
        """End every open stream: `abort` (UNAVAILABLE) or `end` (OK)."""
        if how not in ("abort", "end"):
            raise ValueError(how)
        for stream in self._streams:
            stream.queue.put_nowait(how)
        return len(self._streams)

    # the service

    async def _subscribe_all(self, request: api.SubscribeAllRequest, context: _Context) -> None:
        self.connections += 1
        if self.refuse_streams:
            await self._notify()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not accepting streams")
        stream = _Stream()
        await context.send_initial_metadata((("subscribed", "true"),))
        self._streams.add(stream)
        await self._notify()
        try:
            while True:
                message = await stream.queue.get()
                if message == "abort":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "node going away")
                if isinstance(message, str):  # "end"
                    return
                await context.write(message)
                stream.sent += 1
        finally:
            self._streams.discard(stream)
            await asyncio.shield(self._notify())


# --- envelopes as node-go carries them ----------------------------------------------------------


def group_topic(group_id: bytes) -> str:
    return f"/xmtp/mls/1/g-{group_id.hex()}/proto"


def welcome_topic(installation_key: bytes) -> str:
    return f"/xmtp/mls/1/w-{installation_key.hex()}/proto"


def group_message(
    group_id: bytes,
    message_id: int,
    *,
    data: bytes | None = None,
    should_push: bool = True,
    timestamp_ns: int | None = None,
) -> api.Envelope:
    """A group message as node-go publishes it: a serialized `GroupMessage` V1 on the group's topic."""
    created_ns = time.time_ns() if timestamp_ns is None else timestamp_ns
    v1 = mls.GroupMessage.V1(
        id=message_id,
        created_ns=created_ns,
        group_id=group_id,
        data=secrets.token_bytes(64) if data is None else data,
        should_push=should_push,
    )
    message = mls.GroupMessage(v1=v1).SerializeToString()
    return api.Envelope(content_topic=group_topic(group_id), timestamp_ns=created_ns, message=message)


def welcome_message(installation_key: bytes, message_id: int) -> api.Envelope:
    created_ns = time.time_ns()
    v1 = mls.WelcomeMessage.V1(
        id=message_id, created_ns=created_ns, installation_key=installation_key, data=secrets.token_bytes(96)
    )
    message = mls.WelcomeMessage(v1=v1).SerializeToString()
    return api.Envelope(
        content_topic=welcome_topic(installation_key), timestamp_ns=created_ns, message=message
    )


def other_envelope(topic: str = "/xmtp/mls/1/i-0123456789abcdef/proto") -> api.Envelope:
    """An envelope of a topic legacy subscriptions never name (identity updates, key packages, v2)."""
    return api.Envelope(content_topic=topic, timestamp_ns=time.time_ns(), message=secrets.token_bytes(32))


# Bytes no Envelope reads as: field 1 (content_topic) given a length past the end.
MALFORMED = b"\x0a\x7fshort"
