"""A delivery job as it travels on a channel's stream, and the retry rule."""

from __future__ import annotations

import binascii
import json
import random
import re
import secrets
from dataclasses import dataclass
from typing import NamedTuple

from app.delivery.types import Hint, Outcome, OutcomeKind

MAX_BACKOFF_SECONDS = 300.0
_PLAIN_ID = re.compile(r"[0-9A-Za-z_-]*")
# Exactly what `_payload` writes: plain id, lowercase hex, decimal numbers, a JSON bool.
_PLAIN_JOB = re.compile(
    rb'\["([0-9A-Za-z_-]*)","([0-9a-f]*)","([0-9a-f]*)","([0-9]+)",(-?[0-9]+),([0-9]+),(true|false)\]'
)


class DeliveryJob(NamedTuple):
    """One delivery attempt to make. A tuple: a worker decodes one per delivery."""

    job_id: str
    recipient_id: bytes
    topic: bytes
    sequence_id: int
    ingested_ns: int
    attempt: int = 1
    # Every attempt so far answered "gone" (webhook 404/410).
    all_gone: bool = True

    @classmethod
    def new(cls, recipient_id: bytes, topic: bytes, sequence_id: int, ingested_ns: int) -> DeliveryJob:
        return cls(secrets.token_hex(8), recipient_id, topic, sequence_id, ingested_ns)

    @property
    def hint(self) -> Hint:
        return Hint(self.topic, self.sequence_id, self.recipient_id)

    def encode(self) -> bytes:
        # Fan-out encodes one job per subscriber, so the common case is written out directly:
        # the same bytes json.dumps(..., separators=(",", ":")) gives (hex strings, plain ints
        # and a bool need no escaping), at a fraction of its cost (with non-default separators
        # json.dumps builds a new encoder on every call). Anything unusual takes json.dumps.
        job_id, ingested, attempt, all_gone = self.job_id, self.ingested_ns, self.attempt, self.all_gone
        if (
            type(ingested) is int
            and type(attempt) is int
            and type(all_gone) is bool
            and type(self.sequence_id) is int
            and _PLAIN_ID.fullmatch(job_id)
        ):
            return _payload(
                job_id,
                self.recipient_id.hex(),
                self.topic.hex(),
                self.sequence_id,
                ingested,
                attempt,
                all_gone,
            )
        fields = [
            job_id,
            self.recipient_id.hex(),
            self.topic.hex(),
            str(self.sequence_id),
            ingested,
            attempt,
            all_gone,
        ]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> DeliveryJob:
        # A worker decodes one per delivery: what `encode` writes in the common case is read by one
        # pattern match, at half json.loads' cost; anything else (an unusual job id) takes json.loads.
        plain = _PLAIN_JOB.fullmatch(payload)
        if plain is not None:
            job_id, recipient, topic, sequence, ingested, attempt, all_gone = plain.groups()
            return cls._make(
                (
                    job_id.decode(),
                    binascii.unhexlify(recipient),
                    binascii.unhexlify(topic),
                    int(sequence),
                    int(ingested),
                    int(attempt),
                    all_gone == b"true",
                )
            )
        job_id, recipient, topic, sequence, ingested, attempt, all_gone = json.loads(payload)
        return cls(
            job_id, bytes.fromhex(recipient), bytes.fromhex(topic), int(sequence), ingested, attempt, all_gone
        )


def first_attempts(
    recipient_ids: list[bytes], topic: bytes, sequence_id: int, ingested_ns: int
) -> list[bytes]:
    """Encoded first-attempt jobs, one per recipient, for one hint: what `DeliveryJob.new(...).encode()`
    gives for each, with the topic encoded once and job ids drawn from one random stem (unique per
    job)."""
    stem, topic_hex = secrets.token_hex(6), topic.hex()
    if type(sequence_id) is not int or type(ingested_ns) is not int:
        raise TypeError("sequence_id and ingested_ns must be int")
    return [
        _payload(f"{stem}{n:x}", rid.hex(), topic_hex, sequence_id, ingested_ns, 1, True)
        for n, rid in enumerate(recipient_ids)
    ]


def _payload(
    job_id: str, recipient_hex: str, topic_hex: str, sequence_id: int, ingested: int, attempt: int, gone: bool
) -> bytes:
    return (
        f'["{job_id}","{recipient_hex}","{topic_hex}","{sequence_id}",'
        f"{ingested},{attempt},{'true' if gone else 'false'}]"
    ).encode()


@dataclass(frozen=True, slots=True)
class Retry:
    job: DeliveryJob
    delay_seconds: float


def next_step(job: DeliveryJob, outcome: Outcome, max_attempts: int, base_seconds: float) -> Retry | Outcome:
    """What follows an attempt: a retry, or the final outcome to record."""
    gone = outcome.kind is OutcomeKind.DEAD and outcome.confirm_by_retry
    retryable = outcome.kind is OutcomeKind.TRANSIENT or gone
    if not retryable:
        return outcome
    all_gone = job.all_gone and gone
    if job.attempt >= max_attempts:
        return Outcome(OutcomeKind.DEAD) if all_gone else Outcome(OutcomeKind.TRANSIENT)
    delay = max(backoff(job.attempt, base_seconds), outcome.delay_seconds or 0.0)
    return Retry(job._replace(attempt=job.attempt + 1, all_gone=all_gone), delay)


def backoff(attempt: int, base_seconds: float) -> float:
    """Exponential with jitter: base * 2^(attempt-1), times a random factor in [0.5, 1.5)."""
    ceiling = min(MAX_BACKOFF_SECONDS, base_seconds * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + random.random())
