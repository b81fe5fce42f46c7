"""Who a caller is, for its quotas (docs/callers.md#the-caller): the principal its credential was
admitted as, else its address: the peer's, or, when the peer is a trusted proxy, the rightmost address
of X-Forwarded-For that is not itself trusted. IPv6 callers count by their /64, as one host's
addresses are. The identity goes to Redis only as a digest, and never to a log line or a label."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence

from app.core.quota_settings import Network

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
UNKNOWN_PEER = "address:unknown"  # a peer without an IP address (a Unix socket): one caller


def caller_digest(identity: str) -> str:
    """What a caller's buckets are keyed by: no identity is kept as it is."""
    return hashlib.sha256(b"xmtp-push caller " + identity.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def grpc_peer_host(peer: str | None) -> str | None:
    """The address of grpc's peer text (`ipv4:10.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:…`)."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


def caller_by_address(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """The identity of an unauthenticated caller. `forwarded_for`: every X-Forwarded-For value of the
    call, in order (read only when the peer is trusted)."""
    address = _address(peer)
    if address is None:
        return UNKNOWN_PEER
    if trusted and _trusted(address, trusted):
        address = _forwarded_caller(address, forwarded_for, trusted)
    return _counted(address)


def _forwarded_caller(peer: Address, values: Sequence[str], trusted: Sequence[Network]) -> Address:
    """Right to left, the first hop that is not a trusted proxy. A hop that is no address ends the
    walk at the last one known (only a proxy wrote what is right of the caller's own entries)."""
    hops = [hop for value in values for hop in value.split(",")]
    caller = peer
    for hop in reversed(hops):
        address = _address(_without_port(hop.strip()))
        if address is None:
            return caller
        caller = address
        if not _trusted(address, trusted):
            return address
    return caller


def _without_port(hop: str) -> str:
    if hop.startswith("["):  # [2001:db8::1]:443
        return hop[1:].partition("]")[0]
    if hop.count(":") == 1:  # 192.0.2.1:443
        return hop.partition(":")[0]
    return hop


def _address(text: str | None) -> Address | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: Address, trusted: Sequence[Network]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def _counted(address: Address) -> str:
    if isinstance(address, ipaddress.IPv6Address):
        return f"address:{ipaddress.IPv6Network((address, 64), strict=False)}"
    return f"address:{address}"
