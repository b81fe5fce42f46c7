"""What the five notifications.v1 RPCs ask, as the transports parse it (contract:
docs/legacy.md#what-each-rpc-does), and what an import of the Go server's database adds
(docs/legacy.md#importing-the-go-servers-data). Values only; the rules are app.legacy.service's
and app.legacy.importing's."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class MechanismKind(enum.IntEnum):
    """A delivery mechanism's kind, stored as its number."""

    APNS = 1
    FCM = 2
    CUSTOM = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Mechanism:
    kind: MechanismKind
    token: str


@dataclass(frozen=True, slots=True)
class RegisterInstallation:
    installation_id: str
    mechanism: Mechanism | None  # None: absent, or no token set in it


@dataclass(frozen=True, slots=True)
class Registered:
    installation_id: str
    valid_until_ms: int


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    topic: str
    is_silent: bool = False
    # The subscription's HMAC key for each thirty-day period given.
    keys: dict[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe (`with_metadata` False: silence and keys of existing subscriptions kept) or
    SubscribeWithMetadata (each subscription's silence and keys as given)."""

    installation_id: str
    subscriptions: tuple[SubscriptionSpec, ...]
    with_metadata: bool


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    installation_id: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteInstallation:
    installation_id: str


@dataclass(frozen=True, slots=True)
class ImportedInstallation:
    installation_id: str
    mechanism: Mechanism | None  # None: the Go server held none it could push to
    deleted: bool


@dataclass(frozen=True, slots=True)
class ImportedSubscription:
    installation_id: str
    topic: str  # the legacy string, whichever form the Go server stored
    active: bool
    is_silent: bool


@dataclass(frozen=True, slots=True)
class ImportedKey:
    installation_id: str
    topic: str
    period: int
    key: bytes
