"""Outbound provider connections through an HTTP CONNECT proxy, as Sygnal makes them.

A deployment in a locked-down network names one proxy: `HTTPS_PROXY` (or `https_proxy`) for every
command, a Matrix `sygnal.yaml`'s `proxy:` for the gateway's apps (it wins there, as in Sygnal), and
`XMTP_PUSH_WEBHOOK_PROXY` for webhooks alone (receivers' URLs stay direct otherwise: their address is
the URL policy's to judge). `NO_PROXY` lists the hosts that go direct. Only https:// targets are
tunnelled; the proxy itself is spoken to in plain HTTP (`http://[user:password@]host:port`), the
credentials sent as Basic Proxy-Authorization. They are never shown: a `Proxy` prints as host:port.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import requests

from app.core.config import Settings
from app.core.proxies import Proxy, parse_proxy_url

log = logging.getLogger(__name__)

# A proxy's answer to CONNECT is a status line and a few headers; more is no proxy we can talk to.
MAX_CONNECT_ANSWER_BYTES = 16 * 1024


class ProxyRefused(OSError):
    """The proxy answered CONNECT with something else than 200 (or no HTTP at all). An OSError: a
    transient outcome to every provider, like a refused connection."""


def parse_no_proxy(text: str | None) -> tuple[str, ...]:
    """NO_PROXY's entries: host names (and their subdomains), `.domain` suffixes, IP addresses, `*`."""
    entries = (part.strip().lower().lstrip(".").removesuffix(".") for part in (text or "").split(","))
    return tuple(dict.fromkeys(entry for entry in entries if entry))


@dataclass(frozen=True, slots=True)
class EgressProxy:
    """Which proxy, if any, carries a connection to a host."""

    proxy: Proxy | None = None
    bypass: tuple[str, ...] = ()

    @classmethod
    def parse(cls, url: str | None, no_proxy: str | None = None) -> EgressProxy:
        return cls(parse_proxy_url(url) if url else None, parse_no_proxy(no_proxy))

    @classmethod
    def for_providers(cls, settings: Settings, configured: str | None = None) -> EgressProxy:
        """Provider traffic's proxy: `configured` (a sygnal.yaml's `proxy:`) or HTTPS_PROXY."""
        url = configured or (settings.https_proxy.get_secret_value() if settings.https_proxy else None)
        return cls.parse(url, settings.no_proxy)

    @classmethod
    def for_webhooks(cls, settings: Settings) -> EgressProxy:
        """Webhooks' proxy: XMTP_PUSH_WEBHOOK_PROXY only (NO_PROXY still applies)."""
        url = settings.webhook_proxy.get_secret_value() if settings.webhook_proxy else None
        return cls.parse(url, settings.no_proxy)

    def for_url(self, url: str) -> Proxy | None:
        """The proxy for an https:// URL not listed in NO_PROXY; None: connect directly."""
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            return None
        return self.for_host(parts.hostname)

    def for_host(self, host: str) -> Proxy | None:
        if self.proxy is None or _bypassed(host.rstrip(".").lower(), self.bypass):
            return None
        return self.proxy


DIRECT = EgressProxy()


def _bypassed(host: str, bypass: tuple[str, ...]) -> bool:
    host = host.strip("[]")
    return any(entry == "*" or host == entry or host.endswith("." + entry) for entry in bypass)


async def open_tunnel(proxy: Proxy, host: str, port: int) -> socket.socket:
    """A connected socket to the proxy, through which CONNECT has opened `host:port`; the caller
    starts TLS on it. ProxyRefused (or another OSError) when the proxy cannot be reached or refuses."""
    loop = asyncio.get_running_loop()
    sock = await _connect(loop, proxy)
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        lines += [f"{name}: {value}" for name, value in proxy.headers.items()]
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode())
        status = await _connect_status(loop, sock)
    except BaseException:
        sock.close()
        raise
    if status != 200:
        sock.close()
        raise refused(proxy, status)
    tunnel_opened(proxy)
    return sock


async def _connect(loop: asyncio.AbstractEventLoop, proxy: Proxy) -> socket.socket:
    try:
        infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError:
        raise unreachable(proxy, "its name does not resolve") from None
    for family, kind, protocol, _, address in infos:
        sock = socket.socket(family, kind, protocol)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError:
            sock.close()
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise unreachable(proxy, "the connection was refused or failed")


async def _connect_status(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int:
    """The status of the proxy's answer to CONNECT, read through its blank line and no further
    (what follows is the tunnelled server's)."""
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        if len(answer) >= MAX_CONNECT_ANSWER_BYTES:
            return 0
        byte = await loop.sock_recv(sock, 1)  # byte by byte: a few hundred, once per connection
        if not byte:
            return 0
        answer += byte
    parts = answer.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return 0
    return int(parts[1])


# --- what the operator is told: one line when a proxy starts failing, one when it carries again.

_failing: set[str] = set()


def refused(proxy: Proxy, status: int) -> ProxyRefused:
    """Note (once per change) that the proxy refused a tunnel with `status` (0: no HTTP answer)."""
    answer = f"answered {status} to CONNECT" if status else "gave no HTTP answer to CONNECT"
    return _failure(proxy, answer)


def unreachable(proxy: Proxy, why: str) -> ProxyRefused:
    return _failure(proxy, f"cannot be reached: {why}")


def _failure(proxy: Proxy, what: str) -> ProxyRefused:
    message = f"the egress proxy {proxy} {what}"
    if proxy.address not in _failing:
        _failing.add(proxy.address)
        log.warning("%s; pushes through it fail as transient until it carries them", message)
    return ProxyRefused(message)


# How httpx ("502 Bad Gateway") and requests ("Tunnel connection failed: 502 ...") word a refusal.
_REFUSAL_STATUS = re.compile(r"(?:^|Tunnel connection failed: )([1-5]\d\d)\b")
_PROXY_ERRORS = (httpx.ProxyError, requests.exceptions.ProxyError)


def note_failure(proxy: Proxy, error: BaseException) -> None:
    """Tell a proxy failure that another client library raised (FCM's httpx, google-auth's
    requests; `error` as wrapped by firebase-admin or not) as our own, once per change."""
    chain = _chain(error)
    if not any(isinstance(link, _PROXY_ERRORS) for link in chain):
        return
    statuses = (_REFUSAL_STATUS.search(str(link)) for link in chain)
    status = next((int(found.group(1)) for found in statuses if found), None)
    if status is None:
        unreachable(proxy, "the connection was refused or failed")
    else:
        refused(proxy, status)


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain and len(chain) < 8:
        chain.append(link)
        cause = getattr(link, "cause", None)  # firebase-admin's errors keep the transport's here
        link = cause if isinstance(cause, BaseException) else (link.__cause__ or link.__context__)
    return chain


def tunnel_opened(proxy: Proxy) -> None:
    if proxy.address in _failing:
        _failing.discard(proxy.address)
        log.warning("the egress proxy %s carries connections again", proxy)
