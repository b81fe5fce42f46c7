"""An envelope as the push backend needs it, whatever source it came from."""

from __future__ import annotations

import enum
from dataclasses import dataclass

UINT64_MAX = 2**64 - 1


class EnvelopeKind(enum.Enum):
    GROUP_MESSAGE = "group_message"
    WELCOME = "welcome"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Envelope:
    topic: bytes
    sequence_id: int
    # The server's timestamp; it decides the HMAC epoch for sender suppression.
    server_ns: int
    kind: EnvelopeKind
    should_push: bool = False
    is_commit_or_proposal: bool = False
    sender_hmac: bytes = b""
    data: bytes = b""
    # Backend clock when the envelope was accepted; subscriptions stored later
    # never receive it (their start position).
    received_ns: int = 0
    # Read where envelopes are taken in only (the legacy API's v3 message, docs/legacy.md#the-v3-message),
    # never queued with a fan-out job: the xmtpd node that originated it (None: not from xmtpd), a
    # welcome's serialized WelcomeMessageInput, and the v3 message an ingest caller gave whole.
    originator_node_id: int | None = None
    welcome_input: bytes = b""
    v3_message: bytes = b""
