"""Callers that start requests and never finish them, over HTTP/2 (gRPC) and HTTP/1.1 (Connect).

A stalled gRPC call sends its headers and a message prefix declaring `declared` bytes, then as much
of the message as the server's flow-control windows let it, never the last byte and never the end of
the stream: what a caller does to make a server hold memory for it. Written with the `h2` library.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

MIB = 1024 * 1024
DECLARED = 4 * MIB - 1  # the largest message the API takes
_ZEROS = bytes(64 * 1024)


@dataclass
class StreamEnd:
    """How a stalled stream ended: its grpc-status (None when reset or cut) and when, after it began."""

    status: str | None
    message: str | None
    seconds: float


@dataclass
class StalledConnection:
    """One HTTP/2 connection carrying stalled gRPC calls."""

    port: int
    path: str
    declared: int
    h2: h2.connection.H2Connection = field(
        default_factory=lambda: h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
    )
    began: dict[int, float] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)
    ends: dict[int, StreamEnd] = field(default_factory=dict)
    server_settings: dict[int, int] = field(default_factory=dict)
    goaway: float | None = None  # when the server said GOAWAY, after the connection began
    closed: float | None = None  # when the server closed the connection
    opened_at: float = 0.0
    _writer: asyncio.StreamWriter | None = None

    async def open(self, streams: int) -> None:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.opened_at = time.monotonic()
        self.h2.initiate_connection()
        for _ in range(streams):
            stream_id = self.h2.get_next_available_stream_id()
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", self.path),
                (":authority", f"127.0.0.1:{self.port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
            self.h2.send_headers(stream_id, headers)
            self.began[stream_id], self.sent[stream_id] = time.monotonic(), 0
            self.h2.send_data(stream_id, b"\x00" + self.declared.to_bytes(4, "big"))
        self._pump()
        await self._flush()
        self._reading = asyncio.create_task(self._read(reader))

    def _pump(self) -> None:
        """Send what the windows allow on every stream still open, short of the message's last byte."""
        for stream_id, sent in self.sent.items():
            if stream_id in self.ends:
                continue
            while (
                room := min(
                    self.h2.local_flow_control_window(stream_id),
                    self.h2.max_outbound_frame_size,
                    self.declared - 1 - sent,
                    len(_ZEROS),
                )
            ) > 0:
                self.h2.send_data(stream_id, _ZEROS[:room])
                sent += room
            self.sent[stream_id] = sent

    async def _flush(self) -> None:
        assert self._writer is not None
        self._writer.write(self.h2.data_to_send())
        await self._writer.drain()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(256 * 1024):
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError:
                    # h2 takes nothing after a GOAWAY, and a graceful one is followed by a PING (and
                    # loses the events of the frames read with it): the GOAWAY came in this read.
                    if self.h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                        raise
                    self.goaway = self.goaway or time.monotonic() - self.opened_at
                    await reader.read()  # until the server closes the connection
                    break
                for event in events:
                    self._on(event)
                if self.goaway is None:  # after GOAWAY, h2 sends nothing more but its answers
                    self._pump()
                await self._flush()
        self.closed = time.monotonic() - self.opened_at

    def _on(self, event: h2.events.Event) -> None:
        now = time.monotonic()
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.server_settings.update({k: v.new_value for k, v in event.changed_settings.items()})
        elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
            found = dict(event.headers or [])
            if "grpc-status" in found and event.stream_id not in self.ends:
                began = self.began[event.stream_id]
                self.ends[event.stream_id] = StreamEnd(
                    found["grpc-status"], found.get("grpc-message"), now - began
                )
        elif isinstance(event, h2.events.StreamReset) and event.stream_id not in self.ends:
            self.ends[event.stream_id] = StreamEnd(None, None, now - self.began[event.stream_id])
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = now - self.opened_at

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        reading = getattr(self, "_reading", None)
        if reading is not None:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    @property
    def body_bytes_sent(self) -> int:
        return sum(self.sent.values())


@contextlib.asynccontextmanager
async def stalled_grpc_calls(
    port: int, path: str, connections: int, streams: int, declared: int = DECLARED
) -> AsyncIterator[list[StalledConnection]]:
    """`connections` connections of `streams` stalled calls each to `path`, closed on leaving."""
    opened = [StalledConnection(port, path, declared) for _ in range(connections)]
    try:
        for connection in opened:
            await connection.open(streams)
        yield opened
    finally:
        for connection in opened:
            await connection.close()


@contextlib.asynccontextmanager
async def stalled_http_bodies(
    port: int, path: str, connections: int, declared: int = DECLARED
) -> AsyncIterator[list[int]]:
    """`connections` HTTP/1.1 POSTs of a body declaring `declared` bytes, each sending as fast as the
    server reads, never the last byte; yields the bytes each has sent so far (updated as they go)."""
    sent = [0] * connections

    async def one(index: int) -> None:
        with contextlib.suppress(ConnectionError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            head = (
                f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/proto\r\n"
                f"content-length: {declared}\r\n\r\n"
            )
            writer.write(head.encode())
            try:
                while sent[index] < declared - len(_ZEROS):
                    writer.write(_ZEROS)
                    await writer.drain()
                    sent[index] += len(_ZEROS)
                await asyncio.Event().wait()  # the last bytes never come
            finally:
                writer.close()

    tasks = [asyncio.create_task(one(i)) for i in range(connections)]
    try:
        yield sent
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
