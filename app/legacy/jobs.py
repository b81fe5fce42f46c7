"""The legacy source's queue work: an envelope to fan out to a topic's legacy subscriptions, and
one push to one installation, on streams of their own (`legacy.envelopes`,
`legacy.deliveries.<channel>`) beside the new API's. Each carries the message it pushes: a legacy
push holds the message itself, not a hint."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import NamedTuple

from app.core.channels import Channel

LEGACY_ENVELOPES = "legacy.envelopes"
# What `encode` writes when no string needs escaping (json.dumps' ASCII output holds no backslash then).
_PLAIN_JOB = re.compile(
    rb'\["([^"\\]*)","([^"\\]*)","([A-Za-z0-9+/=]*)",(-?[0-9]+),"([^"\\]*)",(true|false),'
    rb"(-?[0-9]+),(-?[0-9]+),([0-9]+),(true|false)\]"
)


def legacy_delivery_stream(channel: Channel) -> str:
    return f"legacy.deliveries.{channel}"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


@dataclass(frozen=True, slots=True)
class LegacyEnvelope:
    """An envelope as legacy subscriptions see it: its topic string, the network's time and the v3
    message a legacy push carries."""

    topic: str
    timestamp_ns: int
    message: bytes
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class LegacyFanoutJob:
    envelope: LegacyEnvelope
    received_ns: int
    # The job covers the subscriptions whose installation id is above `after` ("": from the start)
    # and at most `until` ("": to the end), compared in the database's order.
    after: str = ""
    until: str = ""

    @property
    def first_page(self) -> bool:
        return not self.after and not self.until

    @property
    def claim_key(self) -> str:
        """One claim per envelope, whichever source (or listener) brought it: hashed, so nothing
        of it is readable in the queue's keys."""
        return "legacy:" + hashlib.sha256(self.envelope.idempotency_key.encode()).hexdigest()[:40]

    def encode(self) -> bytes:
        e = self.envelope
        fields = [
            e.topic,
            e.timestamp_ns,
            _b64(e.message),
            e.idempotency_key,
            self.received_ns,
            self.after,
            self.until,
        ]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> LegacyFanoutJob:
        # Entries queued before ranges existed have no `until`: they cover the rest of the topic.
        topic, timestamp_ns, message, key, received_ns, after, *until = json.loads(payload)
        envelope = LegacyEnvelope(str(topic), int(timestamp_ns), base64.b64decode(message), str(key))
        return cls(envelope, int(received_ns), str(after), str(until[0]) if until else "")


class LegacyDeliveryJob(NamedTuple):
    """One legacy push to one installation, as it travels on its channel's stream."""

    installation_id: str
    topic: str
    message: bytes
    timestamp_ns: int
    idempotency_key: str
    is_silent: bool
    created_ns: int  # the subscription's creation (the HTTP delivery tells it)
    ingested_ns: int
    attempt: int = 1
    all_gone: bool = True

    @property
    def retry_key(self) -> str:
        """Retries wait under their own key: each push carries its own message, so a newer one
        never makes an older one needless (keyed per installation and envelope)."""
        material = f"{self.installation_id}\x00{self.idempotency_key}".encode()
        return hashlib.sha256(material).hexdigest()[:32]

    def encode(self) -> bytes:
        shared = shared_fields(self.topic, self.message, self.timestamp_ns, self.idempotency_key)
        return encode_delivery(
            self.installation_id,
            shared,
            self.is_silent,
            self.created_ns,
            self.ingested_ns,
            self.attempt,
            self.all_gone,
        )

    @classmethod
    def decode(cls, payload: bytes) -> LegacyDeliveryJob:
        # A worker decodes one per push: a job whose strings need no escaping (the usual one) is read
        # by one pattern match, at a fraction of json.loads' cost; any other takes json.loads.
        plain = _PLAIN_JOB.fullmatch(payload)
        if plain is not None:
            installation, topic, message, timestamp_ns, key, silent, created, ingested, attempt, gone = (
                plain.groups()
            )
            return cls(
                installation.decode(),
                topic.decode(),
                binascii.a2b_base64(message),
                int(timestamp_ns),
                key.decode(),
                silent == b"true",
                int(created),
                int(ingested),
                int(attempt),
                gone == b"true",
            )
        fields = json.loads(payload)
        installation, topic, message, timestamp_ns, key, silent, created, ingested, attempt, gone = fields
        return cls(
            str(installation),
            str(topic),
            base64.b64decode(message),
            int(timestamp_ns),
            str(key),
            bool(silent),
            int(created),
            int(ingested),
            int(attempt),
            bool(gone),
        )


def shared_fields(topic: str, message: bytes, timestamp_ns: int, idempotency_key: str) -> str:
    """The part of a delivery job every installation pushed one envelope shares, written once per page
    of a fan-out rather than once per subscriber (the message's base64 is most of a job's bytes)."""
    return json.dumps([topic, _b64(message), timestamp_ns, idempotency_key], separators=(",", ":"))[1:-1]


def encode_delivery(
    installation_id: str,
    shared: str,
    is_silent: bool,
    created_ns: int,
    ingested_ns: int,
    attempt: int = 1,
    all_gone: bool = True,
) -> bytes:
    """The bytes `LegacyDeliveryJob(...).encode()` gives, with the shared part already written: the same
    as json.dumps of its fields with compact separators."""
    head = _json_string(installation_id)
    tail = f"{_bool(is_silent)},{int(created_ns)},{int(ingested_ns)},{int(attempt)},{_bool(all_gone)}"
    return f"[{head},{shared},{tail}]".encode()


def _json_string(text: str) -> str:
    """json.dumps(text): an id of printable ASCII without quote or backslash (the usual one) as it is."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


def _bool(value: bool) -> str:
    return "true" if value else "false"
