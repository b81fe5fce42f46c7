"""Whether a legacy subscription is pushed a message: sender suppression per 30-day period, then the
sender's `should_push`.

Contract: docs/legacy.md#eligibility. Welcomes and group messages that do not parse are always
pushed; `is_commit` is not read.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping

from app.legacy.messages import MessageKind, ParsedMessage

PERIOD_NS = 2_592_000 * 1_000_000_000  # thirty days


class Verdict(enum.Enum):
    PUSH = "push"
    SUPPRESSED = "suppressed"  # the subscriber sent it (its key for the period signs the data)
    INELIGIBLE = "ineligible"  # the sender asked for no push


def period(timestamp_ns: int) -> int:
    """Thirty-day periods since the Unix epoch, from the network's timestamp (never this host's clock)."""
    return timestamp_ns // PERIOD_NS


def verdict(message: ParsedMessage, keys: Mapping[int, bytes], timestamp_ns: int) -> Verdict:
    """`keys`: the subscription's HMAC keys by period."""
    if message.kind is not MessageKind.GROUP:
        return Verdict.PUSH
    key = keys.get(period(timestamp_ns))
    if key and message.sender_hmac and _signed_by(key, message):
        return Verdict.SUPPRESSED
    return Verdict.PUSH if message.should_push else Verdict.INELIGIBLE


def _signed_by(key: bytes, message: ParsedMessage) -> bool:
    expected = hmac.digest(key, message.data, hashlib.sha256)
    return hmac.compare_digest(expected, message.sender_hmac)
