"""A minimal webhook receiver for the pipeline benchmark, meant to run in its own process.

    python -m bench.receiver [--host 127.0.0.1] [--port 0] [--sample-every 1000]

Raw asyncio Protocol + httptools (uvloop when installed), HTTP/1.1 keep-alive, answers every
`POST /hook` with `200` and an empty body. The hot path only stores the body bytes and the
arrival time (`time.monotonic_ns()`: CLOCK_MONOTONIC, which is system-wide on Linux, so the
benchmark process can subtract its own send times from it). Signatures are not checked here:
every `--sample-every`-th request keeps its webhook headers, and the benchmark verifies those
samples afterwards with the recipients' keys (`standardwebhooks`), off the hot path.

Control routes (same port):
- `GET /stats` -> `{"count": N}` (hook requests since the last reset)
- `POST /reset` -> forget everything
- `POST /dump` with the body a file path -> writes JSON
  `{"records": [[recipient_hex, topic_b64, sequence_id, arrival_ns], ...], "samples": [[headers, body,
   arrival_unix_seconds], ...],
   "bad": N}` and answers `{"written": N}`

Prints `receiver listening on <port>` on stdout once bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import httptools

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
OK_CLOSE = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
SAMPLE_HEADERS = (b"webhook-id", b"webhook-timestamp", b"webhook-signature", b"content-type")


class State:
    def __init__(self, sample_every: int) -> None:
        self.sample_every = max(1, sample_every)
        self.reset()

    def reset(self) -> None:
        self.bodies: list[bytes] = []
        self.times: list[int] = []
        self.samples: list[tuple[dict[str, str], bytes, float]] = []  # headers, body, wall-clock arrival
        self.connections_opened = 0


class HookProtocol(asyncio.Protocol):
    __slots__ = ("body", "headers", "parser", "sampled", "state", "transport", "url")

    def __init__(self, state: State) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.headers: dict[str, str] | None = None
        self.sampled = False

    # ---- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.state.connections_opened += 1

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            self.transport.close()

    # ---- httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.sampled = (len(self.state.bodies) % self.state.sample_every) == 0
        self.headers = {} if self.sampled else None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers is not None:
            lowered = name.lower()
            if lowered in SAMPLE_HEADERS:
                self.headers[lowered.decode()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        arrival = time.monotonic_ns()
        assert self.transport is not None
        keep_alive = self.parser.should_keep_alive()
        if self.url == b"/hook":
            body = b"".join(self.body)
            state = self.state
            state.bodies.append(body)
            state.times.append(arrival)
            if self.headers is not None:
                state.samples.append((self.headers, body, time.time()))
            self.transport.write(OK if keep_alive else OK_CLOSE)
        else:
            self._control(b"".join(self.body), keep_alive)
        if not keep_alive:
            self.transport.close()

    def _control(self, body: bytes, keep_alive: bool) -> None:
        method = self.parser.get_method()
        state = self.state
        if self.url == b"/stats":
            answer: dict[str, Any] = {"count": len(state.bodies), "connections": state.connections_opened}
        elif self.url == b"/reset" and method == b"POST":
            state.reset()
            answer = {"reset": True}
        elif self.url == b"/dump" and method == b"POST":
            answer = {"written": dump(state, body.decode())}
        else:
            self._send(404, {"error": "unknown route"}, keep_alive)
            return
        self._send(200, answer, keep_alive)

    def _send(self, status: int, document: dict[str, Any], keep_alive: bool) -> None:
        payload = json.dumps(document).encode()
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        if not keep_alive:
            head += "connection: close\r\n"
        assert self.transport is not None
        self.transport.write(head.encode() + b"\r\n" + payload)


def dump(state: State, path: str) -> int:
    records = []
    bad = 0
    for body, arrival in zip(state.bodies, state.times, strict=True):
        try:
            document = json.loads(body)
            records.append(
                [document["recipient_id"], document["topic"], int(document["sequence_id"]), arrival]
            )
        except (ValueError, KeyError, TypeError):
            bad += 1
    samples = [[headers, body.decode(errors="replace"), at] for headers, body, at in state.samples]
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump({"records": records, "samples": samples, "bad": bad}, handle, separators=(",", ":"))
    os.replace(tmp, path)
    return len(records)


async def serve(host: str, port: int, sample_every: int) -> None:
    state = State(sample_every)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HookProtocol(state), host, port, backlog=4096, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"receiver listening on {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sample-every", type=int, default=1000, help="keep headers of every Nth request")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args(argv)
    runner = asyncio.run
    if not args.no_uvloop:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    runner(serve(args.host, args.port, args.sample_every))
    return 0


if __name__ == "__main__":
    sys.exit(main())
