"""The delivery job: one hint to one recipient as it travels on its channel's stream."""

from __future__ import annotations

import binascii
import hashlib
import json
import re
from typing import NamedTuple

from app.fanout.hints import Hint

# Exactly what `_payload` writes: lowercase hex, decimal numbers, a JSON bool.
_PLAIN_JOB = re.compile(rb'\["([0-9a-f]*)","([0-9a-f]*)","([0-9]+)",(-?[0-9]+),([0-9]+),(true|false)\]')
# Earlier versions wrote a job id first; entries they queued still decode.
_FIELDS_WITH_JOB_ID = 7


class DeliveryJob(NamedTuple):
    """One delivery attempt to make. A tuple: a worker decodes one per delivery. A hint has one job,
    made by the one fan-out of its envelope, so the hint is the job's identity."""

    recipient_id: bytes
    topic: bytes
    sequence_id: int
    ingested_ns: int
    attempt: int = 1
    # Every attempt so far answered "gone" (webhook 404/410).
    all_gone: bool = True

    @property
    def hint(self) -> Hint:
        return Hint(self.topic, self.sequence_id, self.recipient_id)

    @property
    def retry_key(self) -> str:
        """One key per (recipient, topic): a retry waiting under it is replaced by a newer hint's
        (the device needs only a topic's latest position). Hashed: no id readable in the queue."""
        return hashlib.sha256(self.recipient_id + b"|" + self.topic).hexdigest()[:32]

    def encode(self) -> bytes:
        # Fan-out encodes one job per subscriber, so the common case is written out directly:
        # the same bytes json.dumps(..., separators=(",", ":")) gives (hex strings, plain ints
        # and a bool need no escaping), at a fraction of its cost (with non-default separators
        # json.dumps builds a new encoder on every call). Anything unusual takes json.dumps.
        sequence, ingested, attempt, gone = self.sequence_id, self.ingested_ns, self.attempt, self.all_gone
        if type(sequence) is int and type(ingested) is int and type(attempt) is int and type(gone) is bool:
            return _payload(self.recipient_id.hex(), self.topic.hex(), sequence, ingested, attempt, gone)
        fields = [
            self.recipient_id.hex(),
            self.topic.hex(),
            str(self.sequence_id),
            ingested,
            attempt,
            gone,
        ]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> DeliveryJob:
        # A worker decodes one per delivery: what `encode` writes in the common case is read by one
        # pattern match, at half json.loads' cost; anything else takes json.loads.
        plain = _PLAIN_JOB.fullmatch(payload)
        if plain is not None:
            recipient, topic, sequence, ingested, attempt, all_gone = plain.groups()
            return cls._make(
                (
                    binascii.unhexlify(recipient),
                    binascii.unhexlify(topic),
                    int(sequence),
                    int(ingested),
                    int(attempt),
                    all_gone == b"true",
                )
            )
        fields = json.loads(payload)
        if isinstance(fields, list) and len(fields) == _FIELDS_WITH_JOB_ID:
            fields = fields[1:]
        recipient, topic, sequence, ingested, attempt, all_gone = fields
        return cls(bytes.fromhex(recipient), bytes.fromhex(topic), int(sequence), ingested, attempt, all_gone)


def first_attempts(
    recipient_ids: list[bytes], topic: bytes, sequence_id: int, ingested_ns: int
) -> list[bytes]:
    """Encoded first-attempt jobs, one per recipient, for one hint: what
    `DeliveryJob(recipient_id, topic, sequence_id, ingested_ns).encode()` gives for each, with
    everything after the recipient written once."""
    if type(sequence_id) is not int or type(ingested_ns) is not int:
        raise TypeError("sequence_id and ingested_ns must be int")
    rest = _payload("", topic.hex(), sequence_id, ingested_ns, 1, True)[4:]  # after '["",'
    return [b'["' + rid.hex().encode() + b'",' + rest for rid in recipient_ids]


def _payload(
    recipient_hex: str, topic_hex: str, sequence_id: int, ingested: int, attempt: int, gone: bool
) -> bytes:
    return (
        f'["{recipient_hex}","{topic_hex}","{sequence_id}",{ingested},{attempt},{"true" if gone else "false"}]'
    ).encode()
