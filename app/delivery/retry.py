"""The retry rule: what follows an attempt's outcome. Pure: the caller queues the retry."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from app.delivery.types import Outcome, OutcomeKind

MAX_BACKOFF_SECONDS = 300.0
# "Gone" (a webhook's 404/410) is believed once this many attempts in a row said so.
GONE_CONFIRMATIONS = 3


class Attempted(Protocol):
    """A queued push's attempt count and whether every attempt so far answered "gone"."""

    @property
    def attempt(self) -> int: ...

    @property
    def all_gone(self) -> bool: ...

    def _replace(self, *, attempt: int = ..., all_gone: bool = ...) -> Self: ...


J = TypeVar("J", bound=Attempted)


@dataclass(frozen=True, slots=True)
class Retry(Generic[J]):
    job: J
    delay_seconds: float


def next_step(
    job: J,
    outcome: Outcome,
    max_attempts: int,
    base_seconds: float,
    window_seconds: float = math.inf,
    age_seconds: float = 0.0,
) -> Retry[J] | Outcome:
    """What follows an attempt: a retry, or the final outcome to record. Retries go on while the
    next one would still start within `window_seconds` of the push's first arrival (it is
    `age_seconds` old now), and for `max_attempts` attempts at most."""
    if outcome.kind is OutcomeKind.DEFERRED:
        delay = outcome.delay_seconds or 0.0
        return Outcome(OutcomeKind.FAILED) if age_seconds + delay > window_seconds else Retry(job, delay)
    gone = outcome.kind is OutcomeKind.DEAD and outcome.confirm_by_retry
    retryable = outcome.kind is OutcomeKind.FAILED or gone
    if not retryable:
        return outcome
    all_gone = job.all_gone and gone
    if all_gone and job.attempt >= min(max_attempts, GONE_CONFIRMATIONS):
        return Outcome(OutcomeKind.DEAD)
    delay = max(backoff(job.attempt, base_seconds), outcome.delay_seconds or 0.0)
    if job.attempt >= max_attempts or age_seconds + delay > window_seconds:
        return Outcome(OutcomeKind.FAILED)
    return Retry(job._replace(attempt=job.attempt + 1, all_gone=all_gone), delay)


def backoff(attempt: int, base_seconds: float) -> float:
    """Exponential with jitter: base * 2^(attempt-1), times a random factor in [0.5, 1.5)."""
    ceiling = min(MAX_BACKOFF_SECONDS, base_seconds * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + random.random())
