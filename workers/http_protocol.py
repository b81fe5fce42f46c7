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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # each request on a kept-alive connection gets its own bound

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_seconds, self._headers_too_slow)

    def _disarm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


def header_bound_protocol(seconds: float) -> type[Any]:
    """The protocol class for uvicorn's `http` option, closing connections whose request headers
    take longer than `seconds`."""
    return type("HeaderBoundProtocol", (_HeaderBoundProtocol,), {"header_seconds": seconds})
