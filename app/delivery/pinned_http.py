"""HTTP posts to URLs that anyone may register (webhooks, Web Push endpoints), made safe to send.

Before every attempt the caller checks the URL policy (`app.delivery.url_policy`) and the
connection is pinned to the addresses that passed it, so a name cannot be pointed inward after it
was registered; through an egress proxy too, which is asked for the (first) checked address, not
the name. Redirects are never followed, and an answer is read up to a bound: its status is what
counts, so a receiver answering with a huge body costs nothing.
"""

from __future__ import annotations

import contextvars
import socket
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from app.core.proxies import Proxy
from app.delivery.egress import DIRECT, EgressProxy, ProxyRefused, refused, tunnel_opened, unreachable
from app.delivery.url_policy import CheckedWebhook

# An answer is read up to this much; a longer one ends the connection rather than being read on.
MAX_ANSWER_BYTES = 4096
# A timeout, a refused or broken connection (or tunnel): the attempt may go better later.
TRANSIENT_ERRORS = (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)

_pinned: contextvars.ContextVar[tuple[str, tuple[str, ...]]] = contextvars.ContextVar("pinned_addresses")


def pin(checked: CheckedWebhook) -> None:
    """Connections made next in this task go only to the addresses the policy checked."""
    _pinned.set((checked.target.host, checked.addresses))


class PinnedResolver(AbstractResolver):
    """Answers only with the addresses the URL policy checked for this attempt, and resolves the
    egress proxy's name (the operator's own) as usual."""

    def __init__(self, proxy_host: str | None = None) -> None:
        self._proxy_host = proxy_host
        self._resolver = aiohttp.ThreadedResolver() if proxy_host else None

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if self._resolver is not None and host == self._proxy_host:
            return await self._resolver.resolve(host, port, family)
        pinned_host, addresses = _pinned.get(("", ()))
        if host.rstrip(".").lower() != pinned_host:
            raise OSError("host was not checked by the URL policy")
        return [_resolve_result(host, address, port) for address in addresses]

    async def close(self) -> None:
        if self._resolver is not None:
            await self._resolver.close()


def _resolve_result(host: str, address: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {"hostname": host, "host": address, "port": port, "family": family, "proto": 0, "flags": 0}


class PinnedSession:
    """An aiohttp session that connects only to pinned addresses, directly or through the egress
    proxy (CONNECT to the checked address and port; TLS still verifies the URL's host name), and
    counts its connections.

    Both through aiohttp's public parts: its `socket_factory` tells each socket it opens (kept
    until closed, to count those open), and the requests this session carries are those in use.
    No timeout of its own (callers bound each attempt with `Deadlines`), no decompression, no
    User-Agent; `on_connect` is called for each connection it opens."""

    def __init__(
        self, max_connections: int, on_connect: Callable[[], None], proxy: EgressProxy = DIRECT
    ) -> None:
        self._on_connect = on_connect
        self._proxy = proxy
        self._sockets: set[socket.socket] = set()
        self._prune_at = 2 * max_connections + 16
        self.in_use = 0
        connector = aiohttp.TCPConnector(
            resolver=PinnedResolver(proxy.proxy.host if proxy.proxy else None),
            socket_factory=self._socket,
            use_dns_cache=False,
            limit=max_connections,
            limit_per_host=0,
            ssl=ssl.create_default_context(),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    def post(self, checked: CheckedWebhook, data: bytes, headers: dict[str, str]) -> Posting:
        """POST `data` to the checked URL (redirects not followed), as `async with`."""
        pin(checked)
        target = checked.target
        proxy = self._proxy.for_host(target.host) if target.scheme == "https" else None
        if proxy is None:
            request = self._session.post(target.url, data=data, headers=headers, allow_redirects=False)
            return Posting(self, request, None)
        url = URL(target.url)
        request = self._session.post(
            url.with_host(checked.addresses[0]),  # the proxy is asked for the checked address
            data=data,
            headers={**headers, "Host": url.host_port_subcomponent or target.host},
            allow_redirects=False,
            server_hostname=target.host,
            proxy=proxy.url,
            proxy_headers=proxy.headers,
        )
        return Posting(self, request, proxy)

    def _socket(self, address: Any) -> socket.socket:
        family, kind, protocol, _, _ = address
        sock = socket.socket(family, kind, protocol)
        if len(self._sockets) >= self._prune_at:
            self._prune()
        self._sockets.add(sock)
        self._on_connect()
        return sock

    def _prune(self) -> None:
        self._sockets = {sock for sock in self._sockets if sock.fileno() != -1}

    def counts(self) -> tuple[int, int]:
        """(open, in use): connections carrying a request (or being opened for one), plus those kept
        alive for the next; none once closed."""
        if self._session.closed:
            return 0, 0
        self._prune()
        return max(len(self._sockets), self.in_use), self.in_use

    async def close(self) -> None:
        await self._session.close()


class Posting:
    """One POST of a PinnedSession, counted in use while it runs; a proxy's refusal comes out as
    egress.ProxyRefused (an OSError: transient)."""

    __slots__ = ("_proxy", "_request", "_session")

    def __init__(self, session: PinnedSession, request: Any, proxy: Proxy | None) -> None:
        self._session, self._request, self._proxy = session, request, proxy

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._session.in_use += 1
        try:
            response: aiohttp.ClientResponse = await self._request.__aenter__()
        except _PROXY_ERRORS as error:  # their text names the URL: not passed on
            self._session.in_use -= 1
            raise self._refusal(error) from None
        except BaseException:
            self._session.in_use -= 1
            raise
        if self._proxy is not None:
            tunnel_opened(self._proxy)
        return response

    async def __aexit__(self, *exc: Any) -> None:
        self._session.in_use -= 1
        await self._request.__aexit__(*exc)

    def _refusal(self, error: BaseException) -> ProxyRefused:
        assert self._proxy is not None
        if isinstance(error, aiohttp.ClientHttpProxyError):
            return refused(self._proxy, error.status)
        return unreachable(self._proxy, "the connection was refused or failed")


_PROXY_ERRORS = (aiohttp.ClientHttpProxyError, aiohttp.ClientProxyConnectionError)


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
