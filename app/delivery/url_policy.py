"""Which webhook URLs may be called: checked at registration and before every delivery.

A URL passes when its scheme is https (http only when insecure targets are
allowed), it has no userinfo, its host is in the allowed domains (when any are
set) and every address it resolves to is globally routable and not this host's
own (unless private targets are allowed); an IPv6 address that embeds an IPv4
one is judged by the IPv4 address. The checked addresses are returned so the
caller connects to exactly those: a name that resolved public at registration
can point inward later.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

from app.core.config import Settings

DNS_TIMEOUT_SECONDS = 5.0
# This host's interface addresses are read again after this: an address added while the process
# runs (a new interface, a floating IP) is refused as a webhook target within it.
OWN_ADDRESSES_SECONDS = 30.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Besides every address that is not globally routable (`is_global`), these: multicast and
# site-local are "global" to the ipaddress module but never a webhook's address.
_BLOCKED_V4 = tuple(
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/4",
        "255.255.255.255/32",
    )
)
_BLOCKED_V6 = tuple(
    ipaddress.IPv6Network(net)
    for net in ("::/128", "::1/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8")
)
# IPv6 forms that carry an IPv4 address in their last 32 bits: NAT64 (well-known and local-use
# prefixes) and the deprecated IPv4-compatible form (::a.b.c.d).
_EMBEDDING_V6 = tuple(ipaddress.IPv6Network(net) for net in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96"))


class UrlNotAllowed(Exception):
    """The URL breaks the policy. Carries no detail: callers must not echo URLs."""


class UrlNotResolved(UrlNotAllowed):
    """The host resolved to no address (possibly a passing DNS failure)."""


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    allow_insecure: bool = False
    allowed_domains: tuple[str, ...] = ()
    allow_private_addresses: bool = False
    # This host's own addresses, refused like private ones (even when public): those read at
    # start-up, or `host`'s current ones when it is given.
    own_addresses: frozenset[str] = frozenset()
    host: HostAddresses | None = field(default=None, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> UrlPolicy:
        return cls(
            allow_insecure=settings.webhook_allow_insecure,
            allowed_domains=settings.webhook_allowed_domains,
            allow_private_addresses=settings.webhook_allow_private_addresses,
            own_addresses=THIS_HOST.current(),
            host=THIS_HOST,
        )

    def current_own_addresses(self) -> frozenset[str]:
        return self.host.current() if self.host is not None else self.own_addresses


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """A URL that passed the syntactic checks."""

    url: str
    scheme: str
    host: str
    port: int
    # "host:port": what per-host limits count by, made once here since checked URLs are memoised.
    destination: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "destination", f"{self.host}:{self.port}")


@dataclass(frozen=True, slots=True)
class CheckedWebhook:
    """A target plus the addresses it resolved to, all of them allowed."""

    target: WebhookTarget
    addresses: tuple[str, ...]


def parse_webhook_url(url: str, policy: UrlPolicy) -> WebhookTarget:
    """Check scheme, userinfo and host without touching the network."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlNotAllowed from None
    if port == 0:  # not connectable; `port or default` below would turn it into 443
        raise UrlNotAllowed
    scheme = parts.scheme.lower()
    if scheme != "https" and not (scheme == "http" and policy.allow_insecure):
        raise UrlNotAllowed
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UrlNotAllowed
    host = (parts.hostname or "").rstrip(".").lower()
    if not host or not host_allowed(host, policy.allowed_domains):
        raise UrlNotAllowed
    return WebhookTarget(url=url, scheme=scheme, host=host, port=port or (443 if scheme == "https" else 80))


def host_allowed(host: str, allowed_domains: Iterable[str]) -> bool:
    """Exact host, or `*.suffix` for a host with at least one label before `.suffix`."""
    domains = tuple(allowed_domains)
    if not domains:
        return True
    for domain in domains:
        if domain.startswith("*."):
            if host.endswith(domain[1:]) and len(host) > len(domain) - 1:
                return True
        elif host == domain:
            return True
    return False


def is_blocked_address(address: IPAddress) -> bool:
    """True unless the address is globally routable. An IPv6 address that carries an IPv4 one
    (mapped, compatible, 6to4, Teredo, NAT64) is judged by the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)
        if embedded:
            return any(is_blocked_address(v4) for v4 in embedded)
        return not address.is_global or any(address in net for net in _BLOCKED_V6)
    return not address.is_global or any(address in net for net in _BLOCKED_V4)


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to, by the forms that embed one."""
    found = [v4 for v4 in (address.ipv4_mapped, address.sixtofour) if v4 is not None]
    if address.teredo is not None:
        found.extend(address.teredo)  # the relay server and the client behind it
    if any(address in net for net in _EMBEDDING_V6):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def local_addresses() -> frozenset[str]:
    """This host's own interface addresses (a webhook aimed at one reaches our own services),
    with any IPv6 zone dropped."""
    addresses = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                addresses.add(str(ipaddress.ip_address(entry.address.split("%", 1)[0])))
    return frozenset(addresses)


class HostAddresses:
    """This host's interface addresses, read again when `max_age` has passed since the last reading
    (interfaces change while a process runs: a VPN, a floating IP, a container network)."""

    def __init__(
        self,
        read: Callable[[], frozenset[str]] = local_addresses,
        max_age: float = OWN_ADDRESSES_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age = max_age
        self._read = read
        self._clock = clock
        self._addresses: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def current(self) -> frozenset[str]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.max_age:
            self._addresses, self._read_at = self._read(), now
        return self._addresses


THIS_HOST = HostAddresses()


# The checks below run before every delivery attempt. The pure parts (URL syntax
# and domain rules for a URL and policy, IP-literal parsing, the blocked-range test
# of one address) are memoised; name resolution is not, so a name is looked up again
# before every attempt.
_CACHE_SIZE = 8192


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _parse_cached(url: str, policy: UrlPolicy) -> WebhookTarget:
    return parse_webhook_url(url, policy)  # a refused URL raises and is not cached


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _address_blocked(address: str) -> bool:
    return is_blocked_address(ipaddress.ip_address(address.split("%", 1)[0]))


async def resolve_host(host: str, port: int) -> tuple[str, ...]:
    """Every address the host resolves to, IP literals as they are; () when none."""
    literal = _ip_literal(host)
    if literal is not None:
        return (literal,)
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=DNS_TIMEOUT_SECONDS
        )
    except (OSError, TimeoutError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


class SharedLookups:
    """Lookups of one name that overlap share one resolution. Every attempt still gets an answer
    that arrived after it asked, but the attempts in flight to one host cost one lookup, not one
    each on the resolver's few threads."""

    def __init__(self) -> None:
        self._in_flight: dict[tuple[str, int], asyncio.Future[tuple[str, ...]]] = {}

    async def resolve(self, host: str, port: int) -> tuple[str, ...]:
        key = (host, port)
        lookup = self._in_flight.get(key)
        if lookup is None:
            lookup = asyncio.ensure_future(resolve_host(host, port))
            self._in_flight[key] = lookup
            lookup.add_done_callback(lambda done: self._forget(key, done))
        # Shielded: one waiter given up (a cancelled attempt) does not cancel the others' lookup.
        return await asyncio.shield(lookup)

    def _forget(self, key: tuple[str, int], done: asyncio.Future[tuple[str, ...]]) -> None:
        if self._in_flight.get(key) is done:
            del self._in_flight[key]


async def check_webhook_url(
    url: str, policy: UrlPolicy, lookups: SharedLookups | None = None
) -> CheckedWebhook:
    """The full policy: syntax, domain list, resolution and blocked ranges. With `lookups`, a name's
    resolution is shared with the overlapping checks of the same host."""
    checked = _checked_literal(url, policy)
    if checked is not None:
        _refuse_blocked(checked.addresses, policy)  # not cached: this host's addresses change
        return checked
    target = _parse_cached(url, policy)
    resolve = lookups.resolve if lookups is not None else resolve_host
    addresses = await resolve(target.host, target.port)
    if not addresses:
        raise UrlNotResolved
    _refuse_blocked(addresses, policy)
    return CheckedWebhook(target=target, addresses=addresses)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _checked_literal(url: str, policy: UrlPolicy) -> CheckedWebhook | None:
    """The syntax check of a URL whose host is an IP literal, which needs no lookup and so is the
    same every time; None for a host name. A refused URL raises and is not cached."""
    target = _parse_cached(url, policy)
    literal = _ip_literal(target.host)
    if literal is None:
        return None
    return CheckedWebhook(target=target, addresses=(literal,))


def _refuse_blocked(addresses: tuple[str, ...], policy: UrlPolicy) -> None:
    if policy.allow_private_addresses:
        return
    own = policy.current_own_addresses()
    if any(_address_blocked(a) or _reaches(a, own) for a in addresses):
        raise UrlNotAllowed


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _reaches(address: str, own_addresses: frozenset[str]) -> bool:
    """Whether the address is one of this host's own, directly or through an embedded IPv4 form."""
    parsed = ipaddress.ip_address(address.split("%", 1)[0])
    forms = [parsed, *embedded_ipv4(parsed)] if isinstance(parsed, ipaddress.IPv6Address) else [parsed]
    return any(str(form) in own_addresses for form in forms)
