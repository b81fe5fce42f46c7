"""A fan-out job: one envelope, and which part of its topic's subscriber list it still covers."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from app.envelopes.types import Envelope, EnvelopeKind


@dataclass(frozen=True, slots=True)
class FanoutJob:
    envelope: Envelope
    # The job covers subscribers whose recipient id is above `after` (exclusive; empty: from the
    # start) and at most `until` (inclusive; empty: to the end).
    after: bytes = b""
    until: bytes = b""

    @property
    def first_page(self) -> bool:
        return not self.after and not self.until

    @property
    def dedup_key(self) -> str:
        """One key per envelope, `(topic, sequence_id)`: it is fanned out once, so each subscriber's
        `(recipient, topic, sequence_id)` is sent once. Hashed, so no topic is readable in the
        queue's keys."""
        material = b"%b|%d" % (self.envelope.topic, self.envelope.sequence_id)
        return hashlib.sha256(material).hexdigest()[:40]

    def encode(self) -> bytes:
        return encode_job(self.envelope, self.envelope.received_ns, self.after, self.until)

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
        # "u" is absent from entries queued before ranges existed: those cover the whole rest.
        return cls(envelope, _unb64(d["a"]), _unb64(d.get("u", "")))


def encode_job(e: Envelope, received_ns: int, after: bytes = b"", until: bytes = b"") -> bytes:
    """`FanoutJob(replace(e, received_ns=received_ns), after, until).encode()` without the copy.

    The same bytes as `json.dumps({"t": ..., "u": ...}, separators=(",", ":"))`, written out directly:
    every string is base64 or a kind name (nothing to escape), every number an int. It runs for every
    envelope taken in."""
    return (
        f'{{"t":"{_b64(e.topic)}","s":"{e.sequence_id}","n":{_json(e.server_ns)},"k":{_kind(e.kind)},'
        f'"p":{_json(e.should_push)},"c":{_json(e.is_commit_or_proposal)},"h":"{_b64(e.sender_hmac)}",'
        f'"d":"{_b64(e.data)}","r":{_json(received_ns)},"a":"{_b64(after)}","u":"{_b64(until)}"}}'
    ).encode()


_KIND_JSON = {kind: json.dumps(kind.value) for kind in EnvelopeKind}


def _kind(kind: EnvelopeKind) -> str:
    return _KIND_JSON.get(kind) or json.dumps(kind.value)


def _json(value: object) -> str:
    """json.dumps of an int or a bool, the common cases first."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    return json.dumps(value)


def _b64(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


def _unb64(value: str) -> bytes:
    return base64.b64decode(value)
