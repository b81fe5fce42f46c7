"""A local APNs: TLS with ALPN h2, HTTP/2 from the `h2` library, scripted answers per device token.

It runs its own event loop in a thread (`FakeApns(...).start()`, or `with FakeApns(...) as fake:`), so
it keeps answering whatever the code under test does to its own loop, and can also run as a separate
process (`python -m fakes.fake_apns`, used by `bench.channels`).

Every request is recorded (connection number, every header in order, the body). The answer depends on
the device token's *name*, the part before the first ".": `gone.17` answers like `gone`. A name may
hold a sequence of replies: the n-th request for one token gets the n-th (the last repeats):

| name | answer |
| --- | --- |
| `ok` (and any unknown name) | 200 |
| `gone` / `expiredtoken` | 410 `Unregistered` / `ExpiredToken` |
| `bad` / `topic` | 400 `BadDeviceToken` / `DeviceTokenNotForTopic` |
| `badtopic` | 400 `BadTopic` (another 400 reason) |
| `busy` | 429 `TooManyRequests` |
| `err` / `unavailable` | 500 `InternalServerError` / 503 `ServiceUnavailable` |
| `expired-once` | 403 `ExpiredProviderToken` on the first request for the token, then 200 |
| `forbidden` | 403 `InvalidProviderToken` (another 403 reason) |
| `toolarge` | 413 `PayloadTooLarge` |
| `slow` | never answers |

Like Apple, an answer other than 200 carries a JSON body `{"reason": "..."}`, and every answer echoes
the request's `apns-id` header. Flow control is honoured both ways: an error body waits until the
client's connection window has room for it. With `pad_length` set (1 to 255), every DATA frame it
sends carries that much padding, which takes window like the body does (RFC 9113 section 6.1).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings

from fakes.loop_thread import run_as_process, serve_in_thread
from fakes.tls import TlsFiles, make_tls_files, server_context

# --------------------------------------------------------------------------- scripts and records


@dataclass(frozen=True)
class Reply:
    status: int
    reason: str | None = None
    delay: float = 0.0  # seconds before answering
    silent: bool = False  # never answer
    held: bool = False  # answer when FakeApns.release() is called


OK = Reply(200)
DEFAULT_REPLIES: dict[str, tuple[Reply, ...]] = {
    "ok": (OK,),
    "gone": (Reply(410, "Unregistered"),),
    "expiredtoken": (Reply(410, "ExpiredToken"),),
    "bad": (Reply(400, "BadDeviceToken"),),
    "topic": (Reply(400, "DeviceTokenNotForTopic"),),
    "badtopic": (Reply(400, "BadTopic"),),
    "busy": (Reply(429, "TooManyRequests"),),
    "err": (Reply(500, "InternalServerError"),),
    "unavailable": (Reply(503, "ServiceUnavailable"),),
    "expired-once": (Reply(403, "ExpiredProviderToken"), OK),
    "forbidden": (Reply(403, "InvalidProviderToken"),),
    "toolarge": (Reply(413, "PayloadTooLarge"),),
    "slow": (Reply(200, silent=True),),
}
EXPIRED_PROVIDER_TOKEN = Reply(403, "ExpiredProviderToken")


@dataclass
class ApnsRequest:
    connection: int
    headers: list[tuple[str, str]]
    body: bytes
    received: float  # time.monotonic()
    reply: Reply | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def path(self) -> str:
        return self.header(":path") or ""

    @property
    def token(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def jwt(self) -> str:
        scheme, _, token = (self.header("authorization") or "").partition(" ")
        assert scheme == "bearer", self.header("authorization")
        return token

    def json(self) -> Any:
        return json.loads(self.body)


def token_name(token: str) -> str:
    return token.split(".", 1)[0]


# --------------------------------------------------------------------------- the server


class _Connection(asyncio.Protocol):
    def __init__(self, fake: FakeApns, number: int) -> None:
        self.fake = fake
        self.number = number
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        # Enforced until the client acknowledges the SETTINGS frame sent after the preface, which
        # advertises `max_concurrent_streams` (streams a client opened before it learnt the limit
        # are accepted, as a real server must).
        self.conn.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1,
                SettingCodes.MAX_HEADER_LIST_SIZE: H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE,
            },
        )
        self.transport: asyncio.Transport | None = None
        self.incoming: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self.blocked: dict[int, bytes] = {}  # error bodies waiting for flow-control room
        # Nothing is written before then: the server's preface (its SETTINGS) reaches the client late.
        self.silent_until = time.monotonic() + fake.preface_delay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        ssl_object = transport.get_extra_info("ssl_object")
        self.fake.alpn.append(ssl_object.selected_alpn_protocol() if ssl_object else None)
        if self.fake.client_ca is not None:  # certificate auth: who the client's certificate names
            self.fake.client_subjects.append(transport.get_extra_info("peercert") or {})
        self.fake.transports.add(self.transport)  # type: ignore[arg-type]
        self.conn.initiate_connection()
        self.conn.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self.fake.max_concurrent_streams})
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.fake.transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._receive(data)
        except Exception as error:  # asyncio would close the connection without a word
            self.fake.failures.append(f"{type(error).__name__}: {error}")
            raise

    def _receive(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except ProtocolError as error:
            self.fake.failures.append(f"{type(error).__name__}: {error}")
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived):
                self.incoming[event.stream_id] = (list(event.headers), bytearray())  # type: ignore[arg-type]
            elif isinstance(event, DataReceived):
                self._data(event)
            elif isinstance(event, StreamEnded):
                self._request(event.stream_id)
            elif isinstance(event, StreamReset):
                self.fake.resets.append(event.error_code)
                self.incoming.pop(event.stream_id, None)
                self.blocked.pop(event.stream_id, None)
            elif isinstance(event, WindowUpdated):
                self._unblock()
            elif isinstance(event, ConnectionTerminated) and self.transport is not None:
                self.transport.close()
        self._flush()

    def _data(self, event: DataReceived) -> None:
        self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        incoming = self.incoming.get(event.stream_id)
        if incoming is None:  # a stream reset here, its data still arriving
            return
        incoming[1].extend(event.data)
        if self.fake.reset_over and len(incoming[1]) > self.fake.reset_over:
            self.conn.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
            del self.incoming[event.stream_id]

    def _request(self, stream_id: int) -> None:
        entry = self.incoming.pop(stream_id, None)
        if entry is None:  # reset here before it ended
            return
        headers, body = entry
        record = ApnsRequest(self.number, headers, bytes(body), time.monotonic())
        fake = self.fake
        reply = fake.reply_for(record)
        record.reply = reply
        if fake.record:
            fake.requests.append(record)
        else:
            fake.unique.add((record.token, record.body))
        fake.count += 1
        fake.last_ns = time.monotonic_ns()  # CLOCK_MONOTONIC: comparable across processes on Linux
        if reply.silent or not fake.answering:
            return
        if reply.delay > 0:
            asyncio.get_running_loop().call_later(reply.delay, self._answer_later, stream_id, record, reply)
        elif reply.held or (fake.hold_until and fake.count < fake.hold_until):
            fake.held.append((self, stream_id, record, reply))
        else:
            self._answer(stream_id, record, reply)
            if fake.hold_until and fake.held:
                held, fake.held = fake.held, []
                for connection, held_id, held_record, held_reply in held:
                    connection._answer(held_id, held_record, held_reply)
                    connection._flush()

    def _answer_later(self, stream_id: int, record: ApnsRequest, reply: Reply) -> None:
        self._answer(stream_id, record, reply)
        self._flush()

    def _answer(self, stream_id: int, record: ApnsRequest, reply: Reply) -> None:
        apns_id = record.header("apns-id") or ""
        headers = [(":status", str(reply.status)), ("apns-id", apns_id)]
        try:
            if reply.status == 200 and reply.reason is None:
                self.conn.send_headers(stream_id, headers, end_stream=True)
                return
            document: dict[str, Any] = {"reason": reply.reason or ""}
            if reply.status == 410:  # Apple adds when the token stopped being valid, in ms
                document["timestamp"] = int(time.time() * 1000)
            body = json.dumps(document, separators=(",", ":")).encode()
            self.conn.send_headers(stream_id, [*headers, ("content-type", "application/json")])
            self.blocked[stream_id] = body
            self._unblock()
        except (StreamClosedError, ProtocolError):
            self.blocked.pop(stream_id, None)  # the client gave up on this stream

    def _unblock(self) -> None:
        pad_length = self.fake.pad_length or None
        padding = 0 if pad_length is None else pad_length + 1  # the Pad Length field counts too
        for stream_id, body in list(self.blocked.items()):
            try:
                if self.conn.local_flow_control_window(stream_id) < len(body) + padding:
                    continue
                self.conn.send_data(stream_id, body, end_stream=True, pad_length=pad_length)
            except (StreamClosedError, ProtocolError):
                pass
            del self.blocked[stream_id]

    def _flush(self) -> None:
        silence = self.silent_until - time.monotonic()
        if silence > 0:
            asyncio.get_running_loop().call_later(silence, self._flush)
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.conn.data_to_send())


class FakeApns:
    """A scripted APNs on 127.0.0.1, serving from its own thread and event loop."""

    def __init__(
        self,
        tls: TlsFiles,
        *,
        port: int = 0,
        max_concurrent_streams: int = 1000,
        record: bool = True,
        client_ca: str | None = None,
    ) -> None:
        self.tls = tls
        # With a CA file, clients must present a certificate it signed (APNs certificate auth).
        self.client_ca = client_ca
        self.client_subjects: list[dict[str, Any]] = []
        self.port = port
        self.max_concurrent_streams = max_concurrent_streams
        self.record = record
        self.requests: list[ApnsRequest] = []
        self.count = 0
        self.unique: set[tuple[str, bytes]] = set()  # (token, body) when not recording
        self.last_ns = 0  # time.monotonic_ns() of the latest request
        self.alpn: list[str | None] = []
        self.resets: list[int] = []  # RST_STREAM error codes received from clients
        self.failures: list[str] = []  # what went wrong reading a client's data (the connection closes)
        self.transports: set[asyncio.Transport] = set()
        self.scripts: dict[str, tuple[Reply, ...]] = {}
        self.expired_jwts: set[str] = set()
        self.answering = True
        self.pad_length = 0  # padding on every DATA frame sent (0: none)
        self.hold_until = 0  # hold every answer until this many requests arrived
        self.preface_delay = 0.0  # seconds a new connection writes nothing (its SETTINGS come late)
        self.reset_over = 0  # a request whose body grows past this many bytes is reset (0: none is)
        self.held: list[tuple[_Connection, int, ApnsRequest, Reply]] = []
        self._seen: dict[str, int] = defaultdict(int)
        self._connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- scripting (callable from any thread; plain assignments)

    def script(self, token_or_name: str, *replies: Reply) -> None:
        self.scripts[token_or_name] = replies

    def expire_jwt(self, jwt: str) -> None:
        """Answer 403 ExpiredProviderToken to every request that presents this JWT."""
        self.expired_jwts.add(jwt)

    def reply_for(self, request: ApnsRequest) -> Reply:
        token = request.token
        if self.expired_jwts:
            _, _, presented = (request.header("authorization") or "").partition(" ")
            if presented in self.expired_jwts:
                return EXPIRED_PROVIDER_TOKEN
        replies = self.scripts.get(token) or self.scripts.get(token_name(token))
        replies = replies or DEFAULT_REPLIES.get(token_name(token)) or (OK,)
        seen = self._seen[token]
        self._seen[token] = seen + 1
        return replies[min(seen, len(replies) - 1)]

    # ---- views

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return self._connections

    def requests_for(self, token: str) -> list[ApnsRequest]:
        return [r for r in self.requests if r.token == token]

    def reset(self) -> None:
        self.requests.clear()
        self.count = 0
        self.last_ns = 0
        self.unique.clear()
        self.resets.clear()
        self.failures.clear()
        self.scripts.clear()
        self.expired_jwts.clear()
        self._seen.clear()
        self.answering = True
        self.pad_length = 0
        self.hold_until = 0
        self.preface_delay = 0.0
        self.reset_over = 0
        self.held = []
        self.max_concurrent_streams = 1000

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[ApnsRequest]:
        """From the caller's loop: wait until `count` requests were recorded."""
        deadline = time.monotonic() + timeout
        while self.count < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fake APNs got {self.count} requests, expected {count}")
            await asyncio.sleep(0.005)
        return list(self.requests)

    # ---- lifecycle

    def _protocol(self) -> _Connection:
        self._connections += 1
        return _Connection(self, self._connections)

    def _context(self) -> ssl.SSLContext:
        context = server_context(self.tls)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.client_ca)
        context.set_alpn_protocols(["h2"])
        return context

    async def serve(self) -> None:
        """Bind and serve on the running loop (the separate-process mode uses this directly)."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            self._protocol, "127.0.0.1", self.port, ssl=self._context(), backlog=1024, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> FakeApns:
        self._thread = serve_in_thread("fake-apns", self.serve)
        return self

    def call(self, function: Callable[[], None]) -> None:
        """Run `function` on the server's loop and wait for it."""
        assert self._loop is not None
        done = threading.Event()

        def wrapped() -> None:
            try:
                function()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(wrapped)
        done.wait(10)

    def release(self) -> None:
        """Answer every held request now."""

        def answer() -> None:
            held, self.held = self.held, []
            for connection, stream_id, record, reply in held:
                connection._answer(stream_id, record, reply)
                connection._flush()

        self.call(answer)

    def drop_connections(self) -> None:
        """Close every open connection (the clients see the connection lost)."""

        def close() -> None:
            for transport in list(self.transports):
                transport.close()

        self.call(close)

    def stop(self) -> None:
        """Stop listening and close every connection: afterwards connections are refused."""
        if self._loop is None or self._thread is None:
            return
        loop, server = self._loop, self._server

        def shutdown() -> None:
            if server is not None:
                server.close()
            for transport in list(self.transports):
                transport.abort()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeApns:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- a separate process


async def _serve_process(args: argparse.Namespace) -> None:
    from aiohttp import web

    tls = make_tls_files(Path(args.tls_dir))
    fake = FakeApns(tls, port=args.port, record=False)
    await fake.serve()

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "count": fake.count,
                "unique": len(fake.unique),
                "connections": fake.connections,
                "last_ns": fake.last_ns,
            }
        )

    async def reset(_: web.Request) -> web.Response:
        fake.reset()
        return web.json_response({"reset": True})

    app = web.Application()
    app.add_routes([web.get("/stats", stats), web.post("/reset", reset)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.control_port)
    await site.start()
    control = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"fake apns listening on {fake.port} control {control} ca {tls.ca_file}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A local scripted APNs (TLS, HTTP/2)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0, help="plain HTTP: GET /stats, POST /reset")
    parser.add_argument("--tls-dir", required=True, help="where the CA and server certificate are written")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args(argv)
    run_as_process(_serve_process(args), uvloop=not args.no_uvloop)
    return 0


# The body a test expects for a hint, written out from docs/hints.md#the-payload-channel-by-channel.
def expected_body(topic: bytes, sequence_id: int) -> dict[str, Any]:
    return {
        "aps": {"content-available": 1},
        "topic": base64.b64encode(topic).decode(),
        "sequence_id": str(sequence_id),
    }


if __name__ == "__main__":
    sys.exit(main())
