"""Request bodies read a few at a time, so that what unfinished requests hold is bounded in all.

A gRPC read that has begun lets the client send its whole declared message (the transport opens the
stream's flow-control window to it), and an HTTP body read takes whatever the client sends: without a
bound, 500 requests that declare 4 MiB and never finish hold 2 GB. So the read of a body beyond its
first window takes a slot: at most `total` at once in the process, at most `per_connection` of them
for one gRPC connection, and at most half of them for HTTP bodies (so that neither port's slow callers
take every slot from the other's). A request waiting for a slot holds no more than its first window (64 KiB),
and its wait counts against the request's time bound, after which it is given up.

The worst case is `total` bodies of the largest size the API takes (4 MiB) at once: 128 MiB with the
defaults. Small requests (a Register is a few hundred bytes) need a slot only for the moment their
already-arrived body is read, so they pass between the slow ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

READ_SLOTS = 32
READ_SLOTS_PER_CONNECTION = 2


@dataclass(slots=True)
class _Connection:
    slots: asyncio.Semaphore
    users: int = 0


@dataclass(slots=True)
class ReadSlots:
    """One per process, shared by the HTTP and gRPC servers."""

    total: int = READ_SLOTS
    per_connection: int = READ_SLOTS_PER_CONNECTION
    _all: asyncio.Semaphore = field(init=False)
    _http: asyncio.Semaphore = field(init=False)
    _connections: dict[str, _Connection] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._all = asyncio.Semaphore(self.total)
        self._http = asyncio.Semaphore(max(1, self.total // 2))

    @contextlib.asynccontextmanager
    async def slot(self, connection: str | None = None) -> AsyncIterator[None]:
        """Hold a slot while reading; `connection` names a gRPC connection (it may carry several
        requests at once, and its share is bounded too); None, an HTTP request's body."""
        if connection is None:
            async with self._http, self._all:
                yield
            return
        held = self._connections.get(connection)
        if held is None:
            held = self._connections[connection] = _Connection(asyncio.Semaphore(self.per_connection))
        held.users += 1
        try:
            async with held.slots, self._all:
                yield
        finally:
            held.users -= 1
            if held.users == 0:
                del self._connections[connection]
