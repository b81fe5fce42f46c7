"""A local xmtpd node for the listener: the firehose and the query API over real gRPC, scriptable.

`FakeXmtpd` is an in-process `grpc.aio` server on a real port (127.0.0.1, port picked by the OS)
serving, from our generated code, `xmtp.xmtpv4.message_api.NotificationApi/SubscribeAllEnvelopes`
and `xmtp.xmtpv4.message_api.QueryApi/QueryEnvelopes` (docs/xmtp-network.md#what-the-listener-reads).

- The store: envelopes per originator, in sequence order, as the node keeps them. `add()` puts
  envelopes in the store only (published while nobody listened); `publish()` puts them in the store
  and sends them, as one `SubscribeEnvelopesResponse`, to every open firehose stream.
- The firehose sends an empty response at once, then what is published, and an empty keep-alive
  every `keepalive_seconds` (0 = none). `drop_streams(how)` ends every open stream mid-stream
  (`abort`: status UNAVAILABLE, `cancel`: status CANCELLED, `end`: the stream finishes with OK), and
  `restart()` stops the whole server and starts it again on the same port (every connection cut);
  `go_silent()` makes the open streams send nothing more while they stay open.
  `refuse_streams = True` turns new streams away with UNAVAILABLE. `publish_on_next_stream(...)`
  stores envelopes and sends them on the next stream right after its first (empty) response, so a
  catch-up query and that stream both deliver them.
- QueryEnvelopes answers, for the requested originators, what the store holds after the cursor, at
  most `limit` (and at most `max_page`) per page; every query is recorded in `queries`.

Builders at the bottom produce real nested envelopes: OriginatorEnvelope ->
UnsignedOriginatorEnvelope -> PayerEnvelope -> ClientEnvelope (aad.target_topic), with MLS framing
for group messages. Nothing here imports the code under test except the generated protobuf modules.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as env
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2 as api
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2_grpc as api_grpc
from fakes.grpc_node import StreamingNode

_StreamContext = grpc.aio.ServicerContext[api.SubscribeAllEnvelopesRequest, api.SubscribeEnvelopesResponse]

NODE_PAGE_LIMIT = 1000  # a query's page, at most (docs/xmtp-network.md)

# --- the node ----------------------------------------------------------------------------------


async def _drop(how: str, context: _StreamContext) -> None:
    """End a stream as `drop_streams(how)` asks: abort (UNAVAILABLE), cancel (CANCELLED), end (OK)."""
    if how == "abort":
        await context.abort(grpc.StatusCode.UNAVAILABLE, "node going away")
    if how == "cancel":
        await context.abort(grpc.StatusCode.CANCELLED, "stream cancelled by the node")


@dataclass(frozen=True)
class Query:
    originator_node_ids: tuple[int, ...]
    cursor: dict[int, int]
    limit: int
    topics: tuple[bytes, ...]
    answered: int  # envelopes in the answer


@dataclass(eq=False)
class _Stream:
    queue: asyncio.Queue[api.SubscribeEnvelopesResponse | str]
    silent: bool = False
    sent: int = 0  # responses written, keep-alives included


@dataclass
class Item:
    """One envelope as the node stores it."""

    node: int
    sequence_id: int
    envelope: env.OriginatorEnvelope
    topic: bytes = b""
    originator_ns: int = 0

    @property
    def raw(self) -> bytes:
        return self.envelope.SerializeToString()


class FakeXmtpd(StreamingNode, api_grpc.NotificationApiServicer, api_grpc.QueryApiServicer):
    def __init__(self, *, keepalive_seconds: float = 0.0, max_page: int = NODE_PAGE_LIMIT) -> None:
        self._streams: set[_Stream] = set()
        super().__init__(self._streams)
        self.keepalive_seconds = keepalive_seconds
        self.max_page = max_page
        self.store: dict[int, list[tuple[int, env.OriginatorEnvelope]]] = {}
        self.queries: list[Query] = []
        self.connections = 0  # SubscribeAllEnvelopes calls received (refused ones included)
        self.refused = 0
        self.refuse_streams = False
        self._on_next_stream: list[Item] = []

    # life

    async def start(self, port: int = 0) -> FakeXmtpd:
        """Serve on `port` (0: one the OS picks)."""
        self._server = await self._serve_on(port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self.drop_streams("cancel")
            await self._server.stop(0.5)
            self._server = None

    async def restart(self, *, down_seconds: float = 0.0) -> None:
        """Cut every connection (the server stops without grace) and listen again on the same port."""
        assert self._server is not None
        await self._server.stop(None)
        self._server = None
        self._streams.clear()
        await self._notify()
        if down_seconds:
            await asyncio.sleep(down_seconds)
        self._server = await self._serve_on(self.port)

    async def _serve_on(self, port: int) -> grpc.aio.Server:
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
        # The generated registration functions carry no annotations.
        api_grpc.add_NotificationApiServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        api_grpc.add_QueryApiServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        if port and bound != port:
            raise OSError(f"could not listen again on port {port}")
        await server.start()
        self.port = bound
        return server

    async def __aenter__(self) -> FakeXmtpd:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # scripting

    def add(self, items: Iterable[Item]) -> None:
        """Into the store only, as if published while no stream was open."""
        for item in items:
            rows = self.store.setdefault(item.node, [])
            if rows and rows[-1][0] >= item.sequence_id:
                keys = [seq for seq, _ in rows]
                if item.sequence_id in keys:
                    raise AssertionError(f"{item.node}:{item.sequence_id} is stored already")
                rows.insert(bisect.bisect(keys, item.sequence_id), (item.sequence_id, item.envelope))
            else:
                rows.append((item.sequence_id, item.envelope))

    def publish(self, items: Sequence[Item]) -> int:
        """Store the envelopes and send them, in one response, to every open stream; returns how many
        streams it went to (silent ones included)."""
        self.add(items)
        return self.send_live(items)

    def send_live(self, items: Sequence[Item]) -> int:
        """Send on the open streams without storing (a node never does this; tests may)."""
        response = api.SubscribeEnvelopesResponse(envelopes=[item.envelope for item in items])
        for stream in self._streams:
            stream.queue.put_nowait(response)
        return len(self._streams)

    def publish_on_next_stream(self, items: Sequence[Item]) -> None:
        self._on_next_stream.extend(items)

    def drop_streams(self, how: str = "abort") -> int:
        """End every open stream: `abort` (UNAVAILABLE), `cancel` (CANCELLED) or `end` (OK)."""
        if how not in ("abort", "cancel", "end"):
            raise ValueError(how)
        streams = list(self._streams)
        for stream in streams:
            stream.queue.put_nowait(how)
        return len(streams)

    def go_silent(self) -> int:
        """The open streams send nothing more (no envelopes, no keep-alives) and stay open."""
        for stream in self._streams:
            stream.silent = True
        return len(self._streams)

    def stored(self, node: int) -> int:
        return len(self.store.get(node, ()))

    # the services

    async def SubscribeAllEnvelopes(
        self, request: api.SubscribeAllEnvelopesRequest, context: _StreamContext
    ) -> None:
        self.connections += 1
        if self.refuse_streams:
            self.refused += 1
            await self._notify()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not accepting streams")
        stream = _Stream(asyncio.Queue())
        self._streams.add(stream)
        try:
            if self._on_next_stream:
                items, self._on_next_stream = self._on_next_stream, []
                self.add(items)
                stream.queue.put_nowait(api.SubscribeEnvelopesResponse(envelopes=[i.envelope for i in items]))
            await context.write(api.SubscribeEnvelopesResponse())
            stream.sent += 1
            await self._notify()
            await self._serve(stream, context)
        finally:
            self._streams.discard(stream)
            await asyncio.shield(self._notify())

    async def _serve(self, stream: _Stream, context: _StreamContext) -> None:
        loop = asyncio.get_running_loop()
        interval = self.keepalive_seconds
        next_keepalive = loop.time() + interval if interval > 0 else None
        while True:
            timeout = None if next_keepalive is None else max(0.0, next_keepalive - loop.time())
            try:
                message = await asyncio.wait_for(stream.queue.get(), timeout)
            except TimeoutError:
                message = api.SubscribeEnvelopesResponse()  # keep-alive
                next_keepalive = loop.time() + interval
            if isinstance(message, str):  # what drop_streams() asked for
                await _drop(message, context)
                return
            if stream.silent:
                continue
            await context.write(message)
            stream.sent += 1

    async def QueryEnvelopes(
        self,
        request: api.QueryEnvelopesRequest,
        context: grpc.aio.ServicerContext[api.QueryEnvelopesRequest, api.QueryEnvelopesResponse],
    ) -> api.QueryEnvelopesResponse:
        query = request.query
        cursor = dict(query.last_seen.node_id_to_sequence_id)
        limit = min(request.limit or self.max_page, self.max_page)
        found: list[env.OriginatorEnvelope] = []
        for node in query.originator_node_ids:
            rows = self.store.get(node, [])
            start = bisect.bisect_right([seq for seq, _ in rows], cursor.get(node, 0))
            found.extend(envelope for _, envelope in rows[start : start + limit - len(found)])
            if len(found) >= limit:
                break
        self.queries.append(
            Query(tuple(query.originator_node_ids), cursor, request.limit, tuple(query.topics), len(found))
        )
        return api.QueryEnvelopesResponse(envelopes=found)


# --- MLS framing (RFC 9420 wire encoding, as docs/xmtp-network.md reads it) -----------------------------------

MLS_VERSION = 1
WIRE_PUBLIC, WIRE_PRIVATE, WIRE_WELCOME, WIRE_GROUP_INFO, WIRE_KEY_PACKAGE = 1, 2, 3, 4, 5
APPLICATION, PROPOSAL, COMMIT = 1, 2, 3
SENDER_MEMBER, SENDER_EXTERNAL, SENDER_NEW_MEMBER_PROPOSAL, SENDER_NEW_MEMBER_COMMIT = 1, 2, 3, 4


def mls_vector(data: bytes, size: int | None = None) -> bytes:
    """An MLS variable-length vector with a 1-, 2- or 4-byte length (the smallest that fits by default)."""
    length = len(data)
    if size is None:
        size = 1 if length < 0x40 else 2 if length < 0x4000 else 4
    if size == 1:
        assert length < 0x40
        return bytes([length]) + data
    if size == 2:
        assert length < 0x4000
        return (0x4000 | length).to_bytes(2, "big") + data
    if size == 4:
        assert length < 0x4000_0000
        return (0x8000_0000 | length).to_bytes(4, "big") + data
    raise ValueError(size)


def private_message(
    content_type: int = APPLICATION,
    *,
    group_id: bytes | None = None,
    epoch: int = 7,
    ciphertext_size: int = 160,
    group_id_size: int | None = None,
    version: int = MLS_VERSION,
) -> bytes:
    """MLSMessage{version, wire_format=PrivateMessage, group_id<V>, epoch, content_type, aad<V>,
    encrypted_sender_data<V>, ciphertext<V>}."""
    group_id = secrets.token_bytes(16) if group_id is None else group_id
    return (
        version.to_bytes(2, "big")
        + WIRE_PRIVATE.to_bytes(2, "big")
        + mls_vector(group_id, group_id_size)
        + epoch.to_bytes(8, "big")
        + bytes([content_type])
        + mls_vector(b"")
        + mls_vector(os.urandom(24))
        + mls_vector(os.urandom(ciphertext_size))
    )


def public_message(
    content_type: int = COMMIT,
    *,
    sender_type: int = SENDER_MEMBER,
    group_id: bytes | None = None,
    epoch: int = 7,
    authenticated_data: bytes = b"",
    group_id_size: int | None = None,
    body_size: int = 120,
    version: int = MLS_VERSION,
) -> bytes:
    """MLSMessage{version, wire_format=PublicMessage, group_id<V>, epoch, sender, aad<V>, content_type,
    content...}; a member or external sender carries a 4-byte index, new-member senders nothing."""
    group_id = secrets.token_bytes(16) if group_id is None else group_id
    sender = bytes([sender_type])
    if sender_type in (SENDER_MEMBER, SENDER_EXTERNAL):
        sender += (3).to_bytes(4, "big")
    return (
        version.to_bytes(2, "big")
        + WIRE_PUBLIC.to_bytes(2, "big")
        + mls_vector(group_id, group_id_size)
        + epoch.to_bytes(8, "big")
        + sender
        + mls_vector(authenticated_data)
        + bytes([content_type])
        + os.urandom(body_size)
    )


def other_wire_format(wire_format: int, size: int = 80) -> bytes:
    """A Welcome, GroupInfo or KeyPackage MLSMessage (never a commit or proposal)."""
    return MLS_VERSION.to_bytes(2, "big") + wire_format.to_bytes(2, "big") + os.urandom(size)


# --- topics ------------------------------------------------------------------------------------


def group_topic(group_id: bytes | None = None) -> bytes:
    return b"\x00" + (secrets.token_bytes(16) if group_id is None else group_id)


def welcome_topic() -> bytes:
    return b"\x01" + secrets.token_bytes(32)


def identity_topic() -> bytes:
    return b"\x02" + secrets.token_bytes(32)


def key_package_topic() -> bytes:
    return b"\x03" + secrets.token_bytes(32)


# --- envelopes -----------------------------------------------------------------------------------


def originator_envelope(
    node: int,
    sequence_id: int,
    client: env.ClientEnvelope,
    *,
    originator_ns: int | None = None,
    blockchain_proof: bool = False,
) -> Item:
    """Wrap a ClientEnvelope in PayerEnvelope, UnsignedOriginatorEnvelope and OriginatorEnvelope."""
    ns = time.time_ns() if originator_ns is None else originator_ns
    payer = env.PayerEnvelope(
        unsigned_client_envelope=client.SerializeToString(),
        payer_signature=env.RecoverableEcdsaSignature(bytes=os.urandom(65)),
        target_originator=node,
        message_retention_days=90,
    )
    unsigned = env.UnsignedOriginatorEnvelope(
        originator_node_id=node,
        originator_sequence_id=sequence_id,
        originator_ns=ns,
        payer_envelope_bytes=payer.SerializeToString(),
        base_fee_picodollars=1_000,
        congestion_fee_picodollars=0,
        expiry_unixtime=int(time.time()) + 86_400 * 90,
    )
    outer = env.OriginatorEnvelope(unsigned_originator_envelope=unsigned.SerializeToString())
    if blockchain_proof:
        outer.blockchain_proof.SetInParent()
    else:
        outer.originator_signature.bytes = os.urandom(65)
    return Item(node, sequence_id, outer, client.aad.target_topic, ns)


def _client(topic: bytes) -> env.ClientEnvelope:
    return env.ClientEnvelope(aad=env.AuthenticatedData(target_topic=topic))


def group_message(
    node: int,
    sequence_id: int,
    topic: bytes,
    *,
    data: bytes | None = None,
    sender_hmac: bytes = b"",
    should_push: bool = True,
    originator_ns: int | None = None,
) -> Item:
    """A group message; `data` defaults to an MLS PrivateMessage carrying an application message."""
    client = _client(topic)
    client.group_message.v1.data = private_message(APPLICATION, group_id=topic[1:]) if data is None else data
    client.group_message.v1.sender_hmac = sender_hmac
    client.group_message.v1.should_push = should_push
    return originator_envelope(node, sequence_id, client, originator_ns=originator_ns)


def commit_message(node: int, sequence_id: int, topic: bytes, *, sender_type: int = SENDER_MEMBER) -> Item:
    """A commit as the network carries it: PublicMessage framing, from originator 0 with a blockchain
    proof (docs/xmtp-network.md) when node is 0."""
    client = _client(topic)
    client.group_message.v1.data = public_message(COMMIT, sender_type=sender_type, group_id=topic[1:])
    client.group_message.v1.should_push = False
    return originator_envelope(node, sequence_id, client, blockchain_proof=node == 0)


def proposal_message(
    node: int, sequence_id: int, topic: bytes, *, sender_type: int = SENDER_EXTERNAL
) -> Item:
    client = _client(topic)
    client.group_message.v1.data = public_message(PROPOSAL, sender_type=sender_type, group_id=topic[1:])
    client.group_message.v1.should_push = False
    return originator_envelope(node, sequence_id, client, blockchain_proof=node == 0)


def welcome_message(
    node: int, sequence_id: int, topic: bytes, *, pointer: bool = False, originator_ns: int | None = None
) -> Item:
    client = _client(topic)
    if pointer:
        client.welcome_message.welcome_pointer.SetInParent()
    else:
        client.welcome_message.v1.SetInParent()
    return originator_envelope(node, sequence_id, client, originator_ns=originator_ns)


def identity_update(node: int, sequence_id: int, topic: bytes | None = None) -> Item:
    client = _client(identity_topic() if topic is None else topic)
    client.identity_update.SetInParent()
    return originator_envelope(node, sequence_id, client)


def key_package(node: int, sequence_id: int, topic: bytes | None = None) -> Item:
    client = _client(key_package_topic() if topic is None else topic)
    client.upload_key_package.SetInParent()
    return originator_envelope(node, sequence_id, client)


# Bytes no protobuf parser accepts: a field tag whose varint never ends.
UNDECODABLE = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"


def garbage(node: int, sequence_id: int, layer: str = "unsigned") -> Item:
    """An OriginatorEnvelope the stream can carry but whose inner layers do not decode.

    layer: `unsigned` (the UnsignedOriginatorEnvelope bytes), `payer` (its payer envelope bytes),
    `client` (the PayerEnvelope's client envelope bytes), or `no_topic` (decodes, but no target topic).
    """
    if layer == "unsigned":
        return Item(node, sequence_id, env.OriginatorEnvelope(unsigned_originator_envelope=UNDECODABLE))
    client_bytes = UNDECODABLE if layer == "client" else _client(b"").SerializeToString()
    if layer not in ("client", "no_topic", "payer"):
        raise ValueError(layer)
    payer_bytes = (
        UNDECODABLE
        if layer == "payer"
        else env.PayerEnvelope(unsigned_client_envelope=client_bytes).SerializeToString()
    )
    unsigned = env.UnsignedOriginatorEnvelope(
        originator_node_id=node,
        originator_sequence_id=sequence_id,
        originator_ns=time.time_ns(),
        payer_envelope_bytes=payer_bytes,
    )
    return Item(
        node, sequence_id, env.OriginatorEnvelope(unsigned_originator_envelope=unsigned.SerializeToString())
    )


__all__ = [
    "APPLICATION",
    "COMMIT",
    "PROPOSAL",
    "FakeXmtpd",
    "Item",
    "Query",
    "commit_message",
    "garbage",
    "group_message",
    "group_topic",
    "identity_update",
    "key_package",
    "mls_vector",
    "other_wire_format",
    "private_message",
    "proposal_message",
    "public_message",
    "welcome_message",
    "welcome_topic",
]
