"""The HTTP/2 connection to APNs: aioapns's protocol and pool, adjusted for long, busy connections.

aioapns is pinned to 4.0 (and h2, hpack to their 4.x, for RequestEncoder); every adjustment it
needs lives here:
- its host is a class attribute; a protocol subclass carries the configured
  endpoint (a staging relay or a local simulator) and port;
- it signs a JWT per connection; the pool hands every connection one shared
  token provider instead (see SharedToken in the provider module);
- its connection never gives back HTTP/2 flow-control credit for response
  bodies, so after 64 KiB of error bodies (about 1,300 410 answers) every
  further error answer on that connection stalls; the connection here gives
  back each DATA frame's flow-controlled length, padding included (a peer that
  pads would otherwise shrink the window until it stalls); it keeps an entry per
  delivered request for the connection's lifetime; and a request given up by
  our timeout stays in its tables, so its late answer raises inside
  data_received and tears the connection down with every request on it. The
  protocol acknowledges bodies, forgets finished streams and resets abandoned
  ones;
- h2 remembers the last 65,536 closed streams of a connection (about 100 bytes each), so a busy
  process grows by some 25 MB over its first quarter-million pushes; a connection here remembers
  CLOSED_STREAMS_KEPT, still seconds of streams at the highest rates, enough to tell a late frame
  on a stream we reset from a protocol error;
- the request itself is built here, not by aioapns, to keep its cost per push
  low (see RequestEncoder): headers go to h2 as we write them (already
  lowercase, no connection headers, so h2's normalising and checking passes
  are skipped);
- its own proxy support sends CONNECT with no Proxy-Authorization and reads the answer with no
  bound; through an egress proxy the TLS connection is made here over a tunnel opened by
  app.delivery.egress (its name still verified);
- it writes to the socket, and re-arms its idle timer, at every request and every read; here the
  bytes h2 has to send go out once per event-loop iteration or every WRITE_BATCH requests, and one
  timer watches for idleness;
- its pool hands out a new connection as soon as TLS is up, when it still counts 1,000 free streams
  whatever the server allows: a burst started then all lands on that connection, beyond the server's
  limit. A connection here is handed out once the server's first SETTINGS frame (the preface every
  HTTP/2 server sends first) has been read, so the pool knows its streams before it fills them;
- a body the server's flow-control window has no room for raises in aioapns, whose pool sleeps a
  second and gives the push up; here the body waits for the server's credit (see
  _send_as_credit_allows);
- it knows no RST_STREAM from the server: the request waited for the deadline and its stream slot
  was never given back (a connection the server refused 1,000 streams on took no more requests); here
  the request fails at once and its slot is freed (`_reset_by_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aioapns.common import NotificationRequest, NotificationResult
from aioapns.connection import (
    APNsBaseClientProtocol,
    APNsKeyConnectionPool,
    APNsTLSClientProtocol,
    AuthorizationHeaderProvider,
)
from aioapns.exceptions import ConnectionClosed
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import DataReceived, Event, StreamReset
from h2.exceptions import H2Error
from hpack import Encoder, HeaderTuple, NeverIndexedHeaderTuple

from app.core.proxies import Proxy
from app.delivery.credentials import ApnsCredentials
from app.delivery.egress import open_tunnel

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc's from Python 3.12

# What we send is built by us, and what APNs answers is read for :status and apns-id only.
_H2_CONFIG = H2Configuration(
    client_side=True,
    normalize_outbound_headers=False,
    validate_outbound_headers=False,
    validate_inbound_headers=False,
)


CLOSED_STREAMS_KEPT = 8192
# Requests a connection holds back before writing them at once. All of a loop iteration's requests in
# one write would save more CPU, but the first would wait for the last to be encoded, and a server
# answering what it has read would sit idle meanwhile: against the local fake, a delivery worker's
# pushes per second fell by a third. Eight keeps most of the saving and the server busy.
WRITE_BATCH = 8


class _H2Connection(H2Connection):
    MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT

    def __init__(self, config: H2Configuration, on_reset: Callable[[int], None]) -> None:
        super().__init__(config=config)
        self._on_reset = on_reset

    def receive_data(self, data: Buffer) -> list[Event]:
        """h2's events for `data`, each DATA frame's credit given back as it is read: its
        flow-controlled length, which counts padding, not the length of the data it carries. A
        stream the server reset is told to `on_reset` and left out (aioapns knows no such event)."""
        events: list[Event] = super().receive_data(data)
        for event in events:
            if isinstance(event, DataReceived) and event.flow_controlled_length:
                self.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamReset) and event.remote_reset:
                self._on_reset(event.stream_id)
        return [event for event in events if not isinstance(event, StreamReset)]


class RequestEncoder(Encoder):
    """HPACK for APNs requests, which repeat most of their headers byte for byte.

    Host, apns-topic, priority, push type and the provider token are the same on every request: after
    the first they are one index each, and those bytes stay valid until the dynamic table changes
    (an insertion, an eviction, a size update), so they are remembered until then. The values that
    change per request (device path, apns-id, collapse id) come as never-indexed tuples: they never
    enter the table, which keeps its indexes stable and keeps guessable values out of the shared
    compression context, and they go without Huffman coding, which costs more CPU in pure Python
    than the few bytes it saves on a request of about 200.
    """

    def __init__(self) -> None:
        super().__init__()
        self._known: dict[tuple[bytes, bytes], bytes] = {}

    def encode(self, headers: Iterable[Any], huffman: bool = True) -> bytes:
        block: list[bytes] = []
        if self.header_table.resized:
            block.append(self._encode_table_size_change())
            self.header_table.resized = False
            self._known.clear()
        for header in headers:
            if isinstance(header, HeaderTuple) and not header.indexable:
                block.append(self.add((header[0], header[1]), True, False))
            else:
                block.append(self._repeated((header[0], header[1]), huffman))
        return b"".join(block)

    def _repeated(self, header: tuple[bytes, bytes], huffman: bool) -> bytes:
        known = self._known.get(header)
        if known is not None:
            return known
        entries = self.header_table.dynamic_entries
        newest = entries[0] if entries else None
        encoded = self.add(header, False, huffman)
        if (entries[0] if entries else None) is newest:
            self._known[header] = encoded  # an index (or name index + value) into an unchanged table
        else:
            self._known.clear()  # the table moved: every remembered index may point elsewhere now
        return encoded


def request_headers(
    request: NotificationRequest, host: bytes, apns_topic: bytes, authorization: bytes | None
) -> list[Any]:
    """aioapns's header list and order for a request, as bytes; per-request values never indexed."""
    headers: list[Any] = [
        (b":method", b"POST"),
        (b":scheme", b"https"),
        NeverIndexedHeaderTuple(b":path", b"/3/device/" + request.device_token.encode()),
        (b"host", host),
        NeverIndexedHeaderTuple(b"apns-id", request.notification_id.encode()),
        (b"apns-topic", request.apns_topic.encode() if request.apns_topic else apns_topic),
    ]
    if request.time_to_live is not None:
        expiration = str(int(time.time()) + request.time_to_live).encode()
        headers.append(NeverIndexedHeaderTuple(b"apns-expiration", expiration))
    if request.priority is not None:
        headers.append((b"apns-priority", str(request.priority).encode()))
    if request.collapse_key is not None:
        headers.append(NeverIndexedHeaderTuple(b"apns-collapse-id", request.collapse_key.encode()))
    if request.push_type is not None:
        headers.append((b"apns-push-type", request.push_type.value.encode()))
    if authorization is not None:  # None: certificate auth, the TLS connection says who we are
        headers.append((b"authorization", authorization))
    return headers


class _Protocol(APNsTLSClientProtocol):
    """aioapns's connection, fixed for long-lived, busy connections (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _H2Connection(_H2_CONFIG, self._reset_by_server)
        self.conn.encoder = RequestEncoder()
        self._host = self.APNS_SERVER.encode()
        self._apns_topic = self.apns_topic.encode()
        self._authorization: tuple[str, bytes] = ("", b"")
        self._write_scheduled = False
        self._unwritten = 0
        self._active_at = 0.0  # loop time of the last write asked for (see refresh_inactivity_timer)
        self._preface_read = asyncio.Event()  # set by the server's first SETTINGS, or the connection lost
        self._lost = False
        self._credit = asyncio.Event()  # set, then cleared, at each read while a body waits for credit
        self._waiting_for_credit = 0

    async def preface(self) -> None:
        """Return once the server's first SETTINGS frame has been read (its stream limit applied);
        raise ConnectionClosed if the connection ends first."""
        await self._preface_read.wait()
        if self._lost:
            raise ConnectionClosed("closed before the server's SETTINGS")

    def on_remote_settings_changed(self, changed_settings: Any) -> None:
        super().on_remote_settings_changed(changed_settings)
        self._preface_read.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._preface_read.set()
        self._credit.set()  # a body waiting for credit stops: its answer is the connection's error
        super().connection_lost(exc)

    def flush(self) -> None:
        """What h2 has to send goes out at the end of the loop iteration, or at once when this is
        the WRITE_BATCH-th call since the last write (a request, or a read: aioapns flushes after
        each), not at every request: pushes started together (a trigger's tokens, a worker's
        deliveries) share TLS writes."""
        self._active_at = self.loop.time()
        self._unwritten += 1
        if self._unwritten >= WRITE_BATCH:
            self._write()
        elif not self._write_scheduled:
            self._write_scheduled = True
            self.loop.call_soon(self._write)

    def _write(self) -> None:
        self._write_scheduled, self._unwritten = False, 0
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def refresh_inactivity_timer(self) -> None:
        """aioapns closes a connection INACTIVITY_TIME after its last write, cancelling and arming a
        timer at every write; here one timer checks when the last write was."""
        self._active_at = self.loop.time()
        if self.inactivity_timer is None:
            self.inactivity_timer = self.loop.call_later(self.INACTIVITY_TIME, self._close_if_idle)

    def _close_if_idle(self) -> None:
        idle = self.loop.time() - self._active_at
        if idle < self.INACTIVITY_TIME:
            self.inactivity_timer = self.loop.call_later(self.INACTIVITY_TIME - idle, self._close_if_idle)
            return
        self.inactivity_timer = None
        self.close()

    def _reset_by_server(self, stream_id: int) -> None:
        """The server refused or cancelled a stream (RST_STREAM): its request fails now, not at the
        deadline, and its slot is given back (aioapns would hold both until the connection ends)."""
        notification_id = self.request_streams.pop(stream_id, None)
        if notification_id is None:
            return  # not ours any more: answered, or abandoned (its slot given back then)
        self.request_statuses.pop(notification_id, None)
        response = self.requests.pop(notification_id, None)
        if response is not None and not response.done():
            response.set_exception(ConnectionClosed("the server reset the stream"))
        self.free_channels.release()

    def on_stream_ended(self, stream_id: int) -> None:
        self.request_streams.pop(stream_id, None)  # a 200 answer has no body to clear it
        super().on_stream_ended(stream_id)

    async def send_notification(self, request: NotificationRequest) -> NotificationResult:
        try:
            return await self._send(request)
        except asyncio.CancelledError:
            self._abandon(request.notification_id)
            raise

    async def _send(self, request: NotificationRequest) -> NotificationResult:
        stream_id = await self.free_channels.acquire()
        headers = request_headers(request, self._host, self._apns_topic, self._authorization_bytes())
        self.conn.send_headers(stream_id=stream_id, headers=headers)
        message: Any = request.message
        # A push's body comes rendered; a message object is written as aioapns writes it.
        body = message if isinstance(message, bytes) else json.dumps(message, ensure_ascii=False).encode()
        response: asyncio.Future[NotificationResult] = self.loop.create_future()
        self.requests[request.notification_id] = response
        self.request_streams[stream_id] = request.notification_id
        if len(body) <= self.conn.local_flow_control_window(stream_id):
            self.conn.send_data(stream_id=stream_id, data=body, end_stream=True)
        else:
            with contextlib.suppress(H2Error):  # the server ended the stream: its answer, or the deadline
                await self._send_as_credit_allows(stream_id, body, response)
        self.flush()
        return await response

    async def _send_as_credit_allows(
        self, stream_id: int, body: bytes, response: asyncio.Future[NotificationResult]
    ) -> None:
        """Send `body` as the server's flow-control windows let it, waiting for their updates.

        A burst of larger bodies (4 KiB alerts, the legacy API's messages) outgrows a connection's
        first 64 KiB of credit before the server has read any; aioapns would raise, and its pool
        then sleeps a second and gives the push up with its stream half sent. Waiting is bounded
        by the send's deadline, which resets the stream; an answer meanwhile ends it."""
        sent = 0
        while sent < len(body) and not self._lost and not response.done():
            room = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.flush()  # what is already queued goes out, so the server can read it
                self._waiting_for_credit += 1
                try:
                    await self._credit.wait()
                finally:
                    self._waiting_for_credit -= 1
                continue
            part = body[sent : sent + room]
            sent += len(part)
            self.conn.send_data(stream_id=stream_id, data=part, end_stream=sent == len(body))

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_credit:  # a WINDOW_UPDATE or SETTINGS may have given some
            self._credit.set()
            self._credit.clear()  # the waiters woken stay woken; later ones wait for the next read

    def _authorization_bytes(self) -> bytes | None:
        if self.auth_provider is None:
            return None
        header = self.auth_provider.get_header()
        if header != self._authorization[0]:  # renewed: encode it once, not per request
            self._authorization = (header, header.encode())
        return self._authorization[1]

    def _abandon(self, notification_id: str) -> None:
        self.requests.pop(notification_id, None)
        self.request_statuses.pop(notification_id, None)
        streams = [sid for sid, nid in self.request_streams.items() if nid == notification_id]
        for stream_id in streams:  # none if it was still waiting for a free stream
            del self.request_streams[stream_id]
            try:
                self.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
            except H2Error:
                continue  # already ended: its slot was given back then
            self.free_channels.release()
        if streams and self.transport is not None and not self.transport.is_closing():
            self.flush()


class EndpointPool(APNsKeyConnectionPool):
    """aioapns's pool of connections to the configured endpoint, sharing one token provider (none
    with certificate auth: the client certificate goes in the TLS context), directly or through
    `proxy`."""

    def __init__(
        self,
        credentials: ApnsCredentials,
        token: AuthorizationHeaderProvider | None,
        max_connections: int,
        on_connect: Callable[[], None] = lambda: None,
        proxy: Proxy | None = None,
    ) -> None:
        parts = urlsplit(credentials.endpoint)
        self._proxy = proxy
        context = None
        if credentials.ca_file or credentials.cert_file:
            context = ssl.create_default_context(cafile=credentials.ca_file)
            if credentials.cert_file:
                context.load_cert_chain(credentials.cert_file)
        super().__init__(
            credentials.key_pem,
            credentials.key_id,
            credentials.team_id,
            credentials.bundle_id,  # the default apns-topic
            max_connections=max_connections,
            max_connection_attempts=1,
            ssl_context=context,
        )
        self.protocol_class = type(
            "EndpointProtocol",
            (_Protocol,),
            {"APNS_SERVER": parts.hostname, "APNS_PORT": parts.port or 443},
        )
        self._token = token
        self._on_connect = on_connect
        # Why the last connection could not be made (None once one is): aioapns raises its own
        # error in its place, which says nothing of DNS, a refusal or TLS.
        self.connect_error: BaseException | None = None

    async def create_connection(self) -> APNsBaseClientProtocol:
        protocol: Any = self.protocol_class
        factory = partial(protocol, self.apns_topic, self.loop, self.discard_connection, self._token)
        try:
            if self._proxy is None:
                connection: APNsBaseClientProtocol = await self._create_connection(factory)
            else:
                connection = await self._create_tunnelled_connection(factory, self._proxy)
        except Exception as error:
            self.connect_error = error
            raise
        try:  # bounded by the send's deadline, like the connecting itself
            await connection.preface()  # type: ignore[attr-defined]
        except BaseException as error:
            connection.close()
            if isinstance(error, Exception):
                self.connect_error = error
            raise
        self.connect_error = None
        self._on_connect()
        return connection

    async def _create_tunnelled_connection(self, factory: Any, proxy: Proxy) -> Any:
        host, port = self.protocol_class.APNS_SERVER, self.protocol_class.APNS_PORT
        sock = await open_tunnel(proxy, host, port)
        try:
            _, protocol = await self.loop.create_connection(
                factory, sock=sock, ssl=self.ssl_context, server_hostname=host
            )
        except BaseException:
            sock.close()
            raise
        return protocol
