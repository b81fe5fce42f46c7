"""The delivery core's values: one push to send, and how the attempt went.

Nothing here knows which source rendered a push (XMTP, a Matrix homeserver, Marmot): each
source renders its own `Push`, and a provider sends it and answers an `Outcome`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


class PushKind(enum.Enum):
    """What the device does with a push."""

    BACKGROUND = "background"  # wakes the app silently (APNs content-available, FCM data only)
    ALERT = "alert"  # shown to the user


class Priority(enum.Enum):
    NORMAL = "normal"
    HIGH = "high"


@dataclass(frozen=True, slots=True)
class ApnsExtras:
    """APNs headers a push may set beyond what its kind implies."""

    push_type: str | None = None  # apns-push-type; default: the push's kind
    apns_topic: str | None = None  # apns-topic; default: the app's bundle id
    # With no push_type: False sends no apns-push-type header at all (a Matrix app configured
    # without one, as Sygnal sends it) instead of the push's kind.
    push_type_from_kind: bool = True


@dataclass(frozen=True, slots=True)
class FcmExtras:
    """The v1 message beyond what a push's kind and priority imply."""

    # Fields merged into the v1 message under ours (an operator's `fcm_options`: analytics
    # labels, Android channel options...); where both set a field, ours wins.
    fcm_options: Mapping[str, Any] | None = None
    # The `apns` block for iOS apps on FCM (priority, push type, content-available); a source
    # that sends data-only messages, as Sygnal does, leaves it out.
    apns_block: bool = True
    # Fields laid over the v1 message once ours are written (a source's own `android`, `webpush` or
    # `apns` blocks, whole or in part); where both set a field, these win.
    message_fields: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class WebhookExtras:
    """How a webhook push is signed, and what else its request carries."""

    # The receiver's Standard Webhooks key; None posts the body unsigned (a receiver that
    # authenticates its caller by a header instead).
    signing_key: bytes | None
    # Headers sent as given beside ours (an operator's `authorization` for its own receiver).
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WebPushKeys:
    """A Web Push subscription's keys (RFC 8291), base64url as the browser gave them: the payload is
    encrypted to them."""

    p256dh: str  # the subscriber's P-256 public key
    auth: str  # the 16-byte authentication secret


class Push(NamedTuple):
    """One push to one address, rendered by its source. (A tuple: one is made per attempt, and a
    tuple costs a fraction of a frozen dataclass to make.)"""

    address: str  # device token, webhook URL, or Web Push endpoint URL
    # What is sent as it is: the JSON body (APNs, webhook) or the data map (FCM); for Web Push, the
    # body before it is encrypted to the subscription's keys.
    payload: bytes | Mapping[str, str]
    kind: PushKind = PushKind.BACKGROUND
    priority: Priority = Priority.NORMAL
    collapse_id: str | None = None
    expires_at: int | None = None  # Unix seconds; None: the channel's default
    # The same for every attempt at one push, so a receiver can drop repeats (webhook-id).
    message_id: str | None = None
    extras: ApnsExtras | FcmExtras | WebhookExtras | WebPushKeys | None = None  # the channel's own


def payload_size(payload: bytes | Mapping[str, str]) -> int:
    """A payload's bytes: a body's length, or a data map's keys and values in UTF-8."""
    if isinstance(payload, bytes):
        return len(payload)
    return sum(len(key.encode()) + len(value.encode()) for key, value in payload.items())


class OutcomeKind(enum.Enum):
    DELIVERED = "delivered"
    FAILED = "failed"  # a transient failure: retried while attempts remain
    DEAD = "dead"  # the token or webhook is gone: forget the address if unchanged
    MISMATCH = "mismatch"  # the token belongs to another app or sender
    REJECTED = "rejected"  # refused for good; not retried
    DEFERRED = "deferred"  # not attempted (its host is busy or parked): again later, no attempt spent


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    # Wait at least this long before the next attempt (a provider's Retry-After).
    delay_seconds: float | None = None
    # The provider's Retry-After as it gave it, where delay_seconds holds a longer wait of the
    # channel's own (an FCM quota's pause): the Matrix gateway waits this, as Sygnal does.
    retry_after: float | None = None
    # A channel-wide pause (an FCM project quota), not one message's problem.
    pause_channel: bool = False
    # DEAD only when every attempt said so (a webhook's 404/410): retry first.
    confirm_by_retry: bool = False
    # While it waits to be tried again, a newer push for the same destination and subject may
    # replace it (a failure: the device needs only the latest). Not so for a push deferred only
    # because its host was busy: every one of those goes.
    replaceable: bool = True
    # The provider refused the credentials (not the push): the channel's key needs fixing.
    credentials_refused: bool = False
    # What happened, in words for an operator (`send-test`): a status and its meaning, "connection
    # refused"; constant text, never a URL, host, token or key. Empty when the kind says it all.
    reason: str = ""


DELIVERED = Outcome(OutcomeKind.DELIVERED)
REJECTED = Outcome(OutcomeKind.REJECTED)
MISMATCH = Outcome(OutcomeKind.MISMATCH)
DEAD = Outcome(OutcomeKind.DEAD)
FAILED = Outcome(OutcomeKind.FAILED)


def deferred(seconds: float, *, replaceable: bool) -> Outcome:
    return Outcome(OutcomeKind.DEFERRED, delay_seconds=seconds, replaceable=replaceable)
