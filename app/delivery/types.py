"""The delivery core's values: what to send, to whom, and how it went.

Nothing here knows where a hint came from (the XMTP network today; a Matrix
homeserver or a Marmot client later): providers receive a Hint and a Target
and answer with an Outcome.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class Hint(NamedTuple):
    """A wake-up hint: `<topic, sequence_id>`, never content. (Hint and Target are tuples: one of
    each is made per attempt, and a tuple costs a fraction of a frozen dataclass to make.)"""

    topic: bytes
    sequence_id: int
    recipient_id: bytes


class Target(NamedTuple):
    """Where a recipient's hints go, as stored when the attempt was made."""

    channel: int
    address: str  # device token or webhook URL
    signing_key: bytes | None
    secret_hash: bytes


class OutcomeKind(enum.Enum):
    DELIVERED = "delivered"
    TRANSIENT = "failed"  # retried while attempts remain
    DEAD = "dead"  # the token or webhook is gone: delete the recipient if unchanged
    MISMATCH = "mismatch"  # the token belongs to another app or sender
    REJECTED = "rejected"  # refused for good; not retried


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    # Wait at least this long before the next attempt (a provider's Retry-After).
    delay_seconds: float | None = None
    # A channel-wide pause (an FCM project quota), not one message's problem.
    pause_channel: bool = False
    # DEAD only when every attempt said so (a webhook's 404/410): retry first.
    confirm_by_retry: bool = False


DELIVERED = Outcome(OutcomeKind.DELIVERED)
REJECTED = Outcome(OutcomeKind.REJECTED)
MISMATCH = Outcome(OutcomeKind.MISMATCH)
DEAD = Outcome(OutcomeKind.DEAD)
TRANSIENT = Outcome(OutcomeKind.TRANSIENT)
