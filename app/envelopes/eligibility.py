"""Which subscriptions an envelope is pushed to: eligibility, start position, sender suppression."""

from __future__ import annotations

import enum
import hashlib
import hmac

from app.envelopes.types import Envelope, EnvelopeKind

HMAC_EPOCH_NS = 2_592_000 * 1_000_000_000  # 30-day periods since the Unix epoch
HMAC_KEY_LENGTH = 42
HMAC_WINDOW = 3
SENDER_HMAC_LENGTH = 32


class Audience(enum.Enum):
    NOBODY = "nobody"
    EVERY_SUBSCRIBER = "every_subscriber"
    COMMIT_SUBSCRIBERS = "commit_subscribers"  # only subscriptions with include_commits


def audience(envelope: Envelope) -> Audience:
    if envelope.kind is EnvelopeKind.WELCOME:
        return Audience.EVERY_SUBSCRIBER
    if envelope.kind is not EnvelopeKind.GROUP_MESSAGE:
        return Audience.NOBODY
    if envelope.is_commit_or_proposal:
        return Audience.COMMIT_SUBSCRIBERS
    return Audience.EVERY_SUBSCRIBER if envelope.should_push else Audience.NOBODY


# Why an envelope is pushed to nobody, for the sender to read (never a topic or a value).
WITHOUT_SHOULD_PUSH = "group_message_without_should_push"
KIND_OTHER = "kind_other"


def not_pushable_reason(envelope: Envelope) -> str | None:
    """Why `audience(envelope)` is nobody, or None when some subscription may receive it."""
    if audience(envelope) is not Audience.NOBODY:
        return None
    return WITHOUT_SHOULD_PUSH if envelope.kind is EnvelopeKind.GROUP_MESSAGE else KIND_OTHER


def hmac_epoch(server_ns: int) -> int:
    """The epoch of the envelope's server timestamp, never of the local clock."""
    return server_ns // HMAC_EPOCH_NS


def wants(envelope: Envelope, target: Audience, start_ns: int, include_commits: bool) -> bool:
    """Eligibility for one subscription, including its start position."""
    if envelope.received_ns < start_ns or target is Audience.NOBODY:
        return False
    return target is Audience.EVERY_SUBSCRIBER or include_commits


def is_own_message(envelope: Envelope, epoch_base: int | None, keys: bytes | None) -> bool:
    """True when the subscriber sent this group message itself; every doubt sends (fail open)."""
    if envelope.kind is not EnvelopeKind.GROUP_MESSAGE or epoch_base is None or not keys:
        return False
    if len(envelope.sender_hmac) != SENDER_HMAC_LENGTH:
        return False
    index = hmac_epoch(envelope.server_ns) - epoch_base
    if not 0 <= index < min(HMAC_WINDOW, len(keys) // HMAC_KEY_LENGTH):
        return False
    key = keys[index * HMAC_KEY_LENGTH : (index + 1) * HMAC_KEY_LENGTH]
    expected = hmac.new(key, envelope.data, hashlib.sha256).digest()
    return hmac.compare_digest(expected, envelope.sender_hmac)
