"""Values the recipient service takes and returns, independent of any transport."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from app.core.channels import Channel


class WireChannel(enum.IntEnum):
    """A recipient's delivery channel as the XMTP API numbers it (and the database stores it)."""

    UNSPECIFIED = 0
    APNS = 1
    FCM = 2
    HTTP = 3

    @property
    def channel(self) -> Channel:
        """The delivery channel (ValueError for UNSPECIFIED, which no stored recipient has)."""
        return Channel(self.name.lower())


# The channels an XMTP recipient may choose, and each one's delivery channel by its number.
XMTP_CHANNELS = tuple(wire for wire in WireChannel if wire is not WireChannel.UNSPECIFIED)
DELIVERY_CHANNELS = {wire.value: wire.channel for wire in XMTP_CHANNELS}


class Target(NamedTuple):
    """Where a recipient's hints go now, as stored: what delivery needs, and compares before
    forgetting a dead one. (A tuple: a worker reads one per delivery, straight from a query row.)"""

    channel: Channel
    address: str  # device token or webhook URL
    signing_key: bytes | None
    secret_hash: bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: WireChannel
    target: str
    signing_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class RegisterCommand:
    recipient_id: bytes
    recipient_secret: bytes
    delivery: Delivery | None
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class UnregisterCommand:
    recipient_id: bytes
    recipient_secret: bytes


class SubscriptionSpec(NamedTuple):
    # A tuple, not a frozen dataclass: a request builds a thousand of them, and a tuple is
    # several times cheaper to make.
    topic: bytes
    hmac_epoch_base: int = 0
    hmac_keys: tuple[bytes, ...] = ()
    include_commits: bool = False


@dataclass(frozen=True, slots=True)
class UpdateSubscriptionsCommand:
    recipient_id: bytes
    recipient_secret: bytes
    adds: tuple[SubscriptionSpec, ...] = field(default_factory=tuple)
    removes: tuple[bytes, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class RecipientState:
    topic_count: int
    channel: WireChannel
    expires_at_ns: int
