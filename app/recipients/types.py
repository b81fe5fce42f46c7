"""Values the recipient service takes and returns, independent of any transport."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple


class Channel(enum.IntEnum):
    """Delivery channel; the numbers are the wire enum's."""

    UNSPECIFIED = 0
    APNS = 1
    FCM = 2
    HTTP = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Target(NamedTuple):
    """Where a recipient's hints go now, as stored: what delivery needs, and compares before
    forgetting a dead one. (A tuple: a worker reads one per delivery, straight from a query row.)"""

    channel: int
    address: str  # device token or webhook URL
    signing_key: bytes | None
    secret_hash: bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: Channel
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
    channel: Channel
    expires_at_ns: int
