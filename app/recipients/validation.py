"""Pure admission checks; each raises the DomainError its row of the admission table names."""

from __future__ import annotations

from app.core import errors
from app.core.errors import Code, DomainError, Violation
from app.recipients.types import Delivery, SubscriptionSpec, UpdateSubscriptionsCommand

ID_LENGTH = 32
SECRET_LENGTH = 32
SIGNING_KEY_MIN, SIGNING_KEY_MAX = 16, 64
# The contract's message stays the constant; the allowed range travels beside it.
SIGNING_KEY_RANGE = Violation("http.signing_key", f"must be {SIGNING_KEY_MIN} to {SIGNING_KEY_MAX} bytes")
MAX_TARGET_CHARS = 2048
MAX_METADATA_BYTES = 4096
MAX_HMAC_KEYS = 3
HMAC_KEY_LENGTH = 42

TOPIC_KIND_GROUP = 0x00
TOPIC_KIND_WELCOME = 0x01
# Only group-message and welcome topics may be subscribed: kind byte -> whole length.
SUBSCRIBABLE_TOPIC_LENGTHS = {TOPIC_KIND_GROUP: 17, TOPIC_KIND_WELCOME: 33}


def check_credentials(recipient_id: bytes, recipient_secret: bytes) -> None:
    """Check 1: both are exactly 32 bytes."""
    if len(recipient_id) != ID_LENGTH or len(recipient_secret) != SECRET_LENGTH:
        raise errors.malformed()


def check_signing_key(delivery: Delivery) -> None:
    """Check 6: the webhook signing key length."""
    key = delivery.signing_key or b""
    if not SIGNING_KEY_MIN <= len(key) <= SIGNING_KEY_MAX:
        raise DomainError(Code.INVALID_ARGUMENT, errors.SIGNING_KEY_LENGTH, SIGNING_KEY_RANGE)


def check_target_and_metadata(delivery: Delivery | None, metadata: bytes) -> Delivery:
    """Check 7: a delivery is chosen, its target is sane, metadata is small."""
    if delivery is None or len(metadata) > MAX_METADATA_BYTES:
        raise errors.malformed()
    target = delivery.target
    if not target or len(target) > MAX_TARGET_CHARS or "\x00" in target:
        raise errors.malformed()
    return delivery


def is_subscribable_topic(topic: bytes) -> bool:
    return len(topic) > 0 and SUBSCRIBABLE_TOPIC_LENGTHS.get(topic[0]) == len(topic)


def check_subscriptions(command: UpdateSubscriptionsCommand) -> None:
    """Check 8: topic kinds and lengths, no topic twice, key windows well formed."""
    topics = [spec.topic for spec in command.adds] + list(command.removes)
    if len(set(topics)) != len(topics) or not all(is_subscribable_topic(t) for t in topics):
        raise DomainError(Code.INVALID_ARGUMENT, errors.SUBSCRIPTION_MALFORMED)
    if not all(_key_window_ok(spec) for spec in command.adds):
        raise DomainError(Code.INVALID_ARGUMENT, errors.SUBSCRIPTION_MALFORMED)


def _key_window_ok(spec: SubscriptionSpec) -> bool:
    return (
        spec.hmac_epoch_base >= 0
        and len(spec.hmac_keys) <= MAX_HMAC_KEYS
        and all(len(key) == HMAC_KEY_LENGTH for key in spec.hmac_keys)
    )
