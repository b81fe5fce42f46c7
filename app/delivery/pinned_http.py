"""HTTP posts to URLs that anyone may register (webhooks, Web Push endpoints), made safe to send.

Before every attempt the caller checks the URL policy (`app.delivery.url_policy`) and pins the
connection to the addresses that passed it, so a name cannot be pointed inward after it was
registered. Redirects are never followed, and an answer is read up to a bound: its status is
what counts, so a receiver answering with a huge body costs nothing.
"""

from __future__ import annotations

import contextvars
import socket
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from app.delivery.url_policy import CheckedWebhook

# An answer is read up to this much; a longer one ends the connection rather than being read on.
MAX_ANSWER_BYTES = 4096
# A timeout, a refused or broken connection: the attempt may go better later.
TRANSIENT_ERRORS = (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)

_pinned: contextvars.ContextVar[tuple[str, tuple[str, ...]]] = contextvars.ContextVar("pinned_addresses")


def pin(checked: CheckedWebhook) -> None:
    """Connections made next in this task go only to the addresses the policy checked."""
    _pinned.set((checked.target.host, checked.addresses))


class PinnedResolver(AbstractResolver):
    """Answers only with the addresses the URL policy checked for this attempt."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        pinned_host, addresses = _pinned.get(("", ()))
        if host.rstrip(".").lower() != pinned_host:
            raise OSError("host was not checked by the URL policy")
        return [_resolve_result(host, address, port) for address in addresses]

    async def close(self) -> None:
        return None


def _resolve_result(host: str, address: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {"hostname": host, "host": address, "port": port, "family": family, "proto": 0, "flags": 0}


class CountingConnector(aiohttp.TCPConnector):
    """A connector that tells each connection it opens, and how many it holds.

    aiohttp counts neither in public: this hooks `_create_connection` and reads the pool's
    `_acquired` and `_conns` (aiohttp 3.14, pinned). A tracing signal would tell the openings too, but
    costs every request a trace object and several awaits."""

    def __init__(self, on_connect: Callable[[], None], **options: Any) -> None:
        super().__init__(**options)
        self._on_connect = on_connect

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        protocol = await super()._create_connection(*args, **kwargs)
        self._on_connect()
        return protocol

    def counts(self) -> tuple[int, int]:
        """(open, in use): connections carrying a request (or being opened for one), plus those kept
        alive for the next."""
        in_use = len(self._acquired)
        return in_use + sum(len(kept) for kept in self._conns.values()), in_use


def pinned_session(max_connections: int, on_connect: Callable[[], None]) -> aiohttp.ClientSession:
    """A session that resolves only pinned addresses, with no timeout of its own (callers bound each
    attempt with `Deadlines`), no decompression and no User-Agent; `on_connect` is called for each
    connection it opens."""
    connector = CountingConnector(
        on_connect,
        resolver=PinnedResolver(),
        use_dns_cache=False,
        limit=max_connections,
        limit_per_host=0,
        ssl=ssl.create_default_context(),
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def connection_counts(session: aiohttp.ClientSession) -> tuple[int, int]:
    """(open, in use) of a pinned session's connections; none once it is closed."""
    connector = session.connector
    if not isinstance(connector, CountingConnector) or connector.closed:
        return 0, 0
    return connector.counts()


async def read_answer(response: aiohttp.ClientResponse) -> None:
    """Read up to MAX_ANSWER_BYTES of the answer; drop the connection if more is coming."""
    left = MAX_ANSWER_BYTES
    while left > 0:
        chunk = await response.content.read(left)
        if not chunk:
            return
        left -= len(chunk)
    if not response.content.at_eof():
        response.close()
