"""uvicorn's HTTP/1.1 protocol with a bound on the time a request's headers may take to arrive.

uvicorn bounds an idle keep-alive connection but not a request whose headers trickle in a byte
at a time, so a slow client could hold a connection open indefinitely. Every adjustment of
uvicorn (held to 0.55.x in pyproject.toml: this subclasses its httptools protocol) lives here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeaderBoundProtocol(HttpToolsProtocol):
    header_seconds = 30.0

    # Each connection checks itself a few times per bound rather than arming a timer per request:
    # a timer made and cancelled for every request cost a few percent of the CPU of a small one.
    # A request whose headers are late is closed between 1 and 1.25 bounds after it began.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_began: float | None = self.loop.time()
        self._check_timer: asyncio.TimerHandle | None = None
        self._schedule_check()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_began = self.loop.time()  # each request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._headers_began = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._check_timer is not None:
            self._check_timer.cancel()
            self._check_timer = None
        super().connection_lost(exc)

    def _schedule_check(self) -> None:
        self._check_timer = self.loop.call_later(self.header_seconds / 4, self._check_headers)

    def _check_headers(self) -> None:
        began = self._headers_began
        if began is not None and self.loop.time() - began >= self.header_seconds:
            self._check_timer = None
            if not self.transport.is_closing():
                self.transport.close()
            return
        self._schedule_check()


def header_bound_protocol(seconds: float) -> type[Any]:
    """The protocol class for uvicorn's `http` option, closing connections whose request headers
    take longer than `seconds`."""
    return type("HeaderBoundProtocol", (_HeaderBoundProtocol,), {"header_seconds": seconds})
