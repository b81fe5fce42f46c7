"""A TCP proxy on 127.0.0.1 that can fail the way a server does: hang (`silent`), or go away (`cut`)."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`.

    - `silent = True` stops forwarding in both directions while keeping every connection open (a
      server that hangs, or a half-open link); False forwards again.
    - `cut()` closes every connection and closes new ones at once (connections reset, as a server
      gone or failing over) until `mend()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def silent(self) -> bool:
        return not self._flowing.is_set()

    @silent.setter
    def silent(self, value: bool) -> None:
        if value:
            self._flowing.clear()
        else:
            self._flowing.set()

    def cut(self) -> None:
        self._cut = True
        for writer in list(self._writers):
            writer.close()

    def mend(self) -> None:
        self._cut = False

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._flowing.set()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.update((writer, upstream_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, upstream_writer)),
            asyncio.create_task(self._pump(upstream_reader, writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._tasks.difference_update(pumps)
        for stream in (writer, upstream_writer):
            self._writers.discard(stream)
            stream.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.close()
