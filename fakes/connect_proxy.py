"""A local HTTP CONNECT proxy, as an egress proxy of a locked-down network: it tunnels to any
host:port it is asked for, records each tunnel's target, may require Basic credentials (407
without them) and may refuse every tunnel with a status of its choosing (502 as a proxy whose
upstream is down). It serves on the caller's event loop (`async with ConnectProxy() as proxy:`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 16 * 1024
REASONS = {200: "Connection established", 407: "Proxy Authentication Required", 502: "Bad Gateway"}


@dataclass
class ConnectProxy:
    credentials: tuple[str, str] | None = None  # (user, password) it requires
    refuse_with: int | None = None  # answer every CONNECT with this status
    tunnels: list[str] = field(default_factory=list)  # targets tunnelled to, in order
    refused: list[str] = field(default_factory=list)  # targets refused (credentials or refuse_with)
    port: int = 0
    _server: asyncio.Server | None = None
    _pipes: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        """Its URL, with the credentials it requires."""
        userinfo = f"{self.credentials[0]}:{self.credentials[1]}@" if self.credentials else ""
        return f"http://{userinfo}127.0.0.1:{self.port}"

    def tunnels_to(self, port: int) -> int:
        return sum(1 for target in self.tunnels if target.rsplit(":", 1)[1] == str(port))

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._pipes.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEAD_BYTES:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" "), "", ""][:3]
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        status = self._judge(method, headers)
        if status != 200:
            self.refused.append(target)
            await _answer(writer, status)
            return
        host, _, port = target.rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        self.tunnels.append(target)
        await _answer(writer, 200)
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()

    def _judge(self, method: str, headers: dict[str, str]) -> int:
        if method != "CONNECT":
            return 405
        if self.credentials is not None:
            expected = base64.b64encode(":".join(self.credentials).encode()).decode()
            given = {name.lower(): value for name, value in headers.items()}.get("proxy-authorization")
            if given != f"Basic {expected}":
                return 407
        return self.refuse_with or 200


async def _answer(writer: asyncio.StreamWriter, status: int) -> None:
    writer.write(f"HTTP/1.1 {status} {REASONS.get(status, 'Refused')}\r\n\r\n".encode())
    await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
