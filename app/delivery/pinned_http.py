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


def pinned_session(max_connections: int) -> aiohttp.ClientSession:
    """A session that resolves only pinned addresses, with no timeout of its own (callers bound each
    attempt with `Deadlines`), no decompression and no User-Agent."""
    connector = aiohttp.TCPConnector(
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
