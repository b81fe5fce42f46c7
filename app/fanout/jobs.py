"""A fan-out job: one envelope, and where in its topic's subscriber list to continue."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from app.envelopes.types import Envelope, EnvelopeKind


@dataclass(frozen=True, slots=True)
class FanoutJob:
    envelope: Envelope
    # Last recipient id of the previous page; empty for the first page.
    after: bytes = b""

    @property
    def first_page(self) -> bool:
        return not self.after

    def encode(self) -> bytes:
        e = self.envelope
        document = {
            "t": _b64(e.topic),
            "s": str(e.sequence_id),
            "n": e.server_ns,
            "k": e.kind.value,
            "p": e.should_push,
            "c": e.is_commit_or_proposal,
            "h": _b64(e.sender_hmac),
            "d": _b64(e.data),
            "r": e.received_ns,
            "a": _b64(self.after),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> FanoutJob:
        d: dict[str, Any] = json.loads(payload)
        envelope = Envelope(
            topic=_unb64(d["t"]),
            sequence_id=int(d["s"]),
            server_ns=int(d["n"]),
            kind=EnvelopeKind(d["k"]),
            should_push=bool(d["p"]),
            is_commit_or_proposal=bool(d["c"]),
            sender_hmac=_unb64(d["h"]),
            data=_unb64(d["d"]),
            received_ns=int(d["r"]),
        )
        return cls(envelope, _unb64(d["a"]))


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _unb64(value: str) -> bytes:
    return base64.b64decode(value)
