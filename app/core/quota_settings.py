"""The settings of what one caller, and one destination, may cost (docs/callers.md#quotas-per-caller):
the quotas per caller, the proxies whose forwarding headers name the caller, and a fast webhook host's
allowance. A part of the one Settings object (app.core.config)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# The default of XMTP_PUSH_WEBHOOK_MAX_PER_FAST_HOST (app.delivery.host_guard).
MAX_PER_FAST_HOST = 64
NOT_A_NETWORK = "each entry must be an IP address or a CIDR network (10.0.0.0/8, fd00::/8)"


def parse_networks(value: Any) -> Any:
    """Comma-separated CIDRs (or a TOML array) as networks; a bare address is its own network. The
    error names no entry: a setting's value is not echoed."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple):
        return value
    networks: list[Network] = []
    for part in (str(part).strip() for part in parts):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(NOT_A_NETWORK) from None
    return tuple(dict.fromkeys(networks))


class QuotaSettings(BaseSettings):
    # Token buckets per caller, refilled evenly over a minute; 0 turns a quota off (the default).
    caller_calls_per_minute: int = Field(0, ge=0, le=10_000_000)
    caller_topic_changes_per_minute: int = Field(0, ge=0, le=100_000_000)
    # Recipients and installations created, all callers together: a ceiling on the database's growth.
    new_recipients_per_minute: int = Field(0, ge=0, le=10_000_000)
    # Peers whose X-Forwarded-For names the caller (a load balancer, a reverse proxy); empty: none.
    trusted_proxies: Annotated[tuple[Network, ...], NoDecode, BeforeValidator(parse_networks)] = ()
    # Webhook attempts in flight to one host per worker once its answers have shown it fast (never
    # fewer than XMTP_PUSH_WEBHOOK_MAX_PER_HOST, the bound of a host not shown fast).
    webhook_max_per_fast_host: int = Field(MAX_PER_FAST_HOST, ge=1, le=4096)

    @property
    def quotas_on(self) -> bool:
        return bool(
            self.caller_calls_per_minute
            or self.caller_topic_changes_per_minute
            or self.new_recipients_per_minute
        )
