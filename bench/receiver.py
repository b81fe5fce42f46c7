"""The webhook receiver the pipeline benchmark posts to, in its own process: `python -m bench.receiver`.

An asyncio Protocol with httptools on uvloop, HTTP/1.1 keep-alive. `POST /hook` is answered 200, empty; kept
are only its body and arrival (CLOCK_MONOTONIC, system-wide on Linux: the benchmark subtracts its own send
times), and for every SAMPLE_EVERY-th its webhook headers, which the benchmark verifies off the hot path.
Control: `GET /stats` ({"count": N}), `POST /reset`, `POST /dump` with a file path as the body, where it
writes {"records": [[recipient hex, sequence id, arrival ns]...], "samples": [[headers, body, unix s]...]}."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from typing import Any

import httptools
import uvloop

OK, CLOSE = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", b"\r\nconnection: close\r\n\r\n"
SAMPLE_EVERY = 1000  # requests, one of which keeps its headers
SAMPLE_HEADERS = {b"webhook-id", b"webhook-timestamp", b"webhook-signature", b"content-type"}
bodies: list[bytes] = []
arrivals: list[int] = []  # monotonic ns
samples: list[tuple[dict[str, str], bytes, float]] = []  # headers, body, wall-clock arrival


class Hook(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport, self.parser = transport, httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0" + CLOSE)
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.body = b"", list[bytes]()
        self.headers: dict[str, str] | None = {} if len(bodies) % SAMPLE_EVERY == 0 else None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers is not None and (name := name.lower()) in SAMPLE_HEADERS:
            self.headers[name.decode()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        arrival, body = time.monotonic_ns(), b"".join(self.body)
        if self.url == b"/hook":
            bodies.append(body)
            arrivals.append(arrival)
            if self.headers is not None:
                samples.append((self.headers, body, time.time()))
            answer = OK
        else:
            answer = control(self.url, body)
        if self.parser.should_keep_alive():
            self.transport.write(answer)
        else:
            self.transport.write(answer.replace(b"\r\n\r\n", CLOSE, 1))
            self.transport.close()


def control(url: bytes, body: bytes) -> bytes:
    answer: dict[str, int] = {}
    if url == b"/stats":
        answer["count"] = len(bodies)
    elif url == b"/reset":
        del bodies[:], arrivals[:], samples[:]
    elif url == b"/dump":
        answer["written"] = dump(body.decode())
    else:
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
    payload = json.dumps(answer).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(payload)
    return head + payload


def dump(path: str) -> int:
    records = []
    for body, arrival in zip(bodies, arrivals, strict=True):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not a hint: not counted
            hint = json.loads(body)
            records.append([hint["recipient_id"], int(hint["sequence_id"]), arrival])
    kept = [[headers, body.decode(errors="replace"), at] for headers, body, at in samples]
    with open(path, "w") as handle:
        json.dump({"records": records, "samples": kept}, handle, separators=(",", ":"))
    return len(records)


async def serve() -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    server = await loop.create_server(Hook, "127.0.0.1", 0, backlog=4096, reuse_address=True)
    print(f"receiver listening on {server.sockets[0].getsockname()[1]}", flush=True)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    uvloop.run(serve())
