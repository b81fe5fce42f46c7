"""The retry rule: what follows an attempt's outcome, under a channel's retry policy. Pure: the
caller queues the retry (XMTP) or waits within its request (the Matrix gateway)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Generic, Protocol, Self, TypeVar

from app.core.config import MAX_ATTEMPTS, RETRY_BASE_SECONDS, RETRY_WINDOW_SECONDS, Settings
from app.delivery.types import Outcome, OutcomeKind

MAX_BACKOFF_SECONDS = 300.0
# "Gone" (a webhook's 404/410) is believed once this many attempts in a row said so.
GONE_CONFIRMATIONS = 3
# In a request: short waits between attempts when the provider gave no Retry-After.
IN_REQUEST_WAITS = (0.2, 0.5, 1.0, 2.0)
# A quota answer (the provider pauses its channel) in a request: tries in all, and the wait doubling
# from this when it gives no Retry-After (Sygnal's; longer than any request's time, so none is made).
PAUSED_TRIES, PAUSED_BASE_SECONDS = 3, 60.0


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
    *,
    floor_seconds: float = 0.0,
) -> Retry[J] | Outcome:
    """What follows an attempt: a retry, or the final outcome to record. Retries go on while the
    next one would still start within `window_seconds` of the push's first arrival (it is
    `age_seconds` old now), and for `max_attempts` attempts at most; none waits under
    `floor_seconds`."""
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
    delay = max(backoff(job.attempt, base_seconds), outcome.delay_seconds or 0.0, floor_seconds)
    if job.attempt >= max_attempts or age_seconds + delay > window_seconds:
        return Outcome(OutcomeKind.FAILED)
    return Retry(job._replace(attempt=job.attempt + 1, all_gone=all_gone), delay)


def backoff(attempt: int, base_seconds: float) -> float:
    """Exponential with jitter: base * 2^(attempt-1), times a random factor in [0.5, 1.5)."""
    ceiling = min(MAX_BACKOFF_SECONDS, base_seconds * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + random.random())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one channel's transient failures are tried again: its schedule, its window, its floor.

    Schedule: a push queued for later waits `base_seconds` doubling (with jitter, at most
    MAX_BACKOFF_SECONDS), for `max_attempts` attempts at most; one retried within a request waits
    `in_request` in turn, and after a quota answer `paused_base_seconds` doubling, `paused_tries`
    tries in all. Window: a queued push is retried while the next attempt would start within
    `window_seconds` of its arrival; within a request, while the request's deadline allows. Floor: no
    wait before a retry is shorter than `floor_seconds` (a provider's own Retry-After may be longer).
    """

    base_seconds: float = RETRY_BASE_SECONDS
    max_attempts: int = MAX_ATTEMPTS
    window_seconds: float = RETRY_WINDOW_SECONDS
    floor_seconds: float = 0.0
    in_request: tuple[float, ...] = IN_REQUEST_WAITS
    paused_tries: int = PAUSED_TRIES
    paused_base_seconds: float = PAUSED_BASE_SECONDS

    def configured(self, settings: Settings) -> RetryPolicy:
        """The policy with the deployment's retry settings (XMTP_PUSH_RETRY_BASE_SECONDS,
        XMTP_PUSH_RETRY_WINDOW_SECONDS, XMTP_PUSH_MAX_ATTEMPTS), which every channel shares."""
        return replace(
            self,
            base_seconds=settings.retry_base_seconds,
            max_attempts=settings.max_attempts,
            window_seconds=settings.retry_window_seconds,
        )

    def next_step(self, job: J, outcome: Outcome, age_seconds: float) -> Retry[J] | Outcome:
        """What follows a queued push's attempt (`age_seconds`: since its first arrival)."""
        return next_step(
            job,
            outcome,
            self.max_attempts,
            self.base_seconds,
            self.window_seconds,
            age_seconds,
            floor_seconds=self.floor_seconds,
        )

    def in_request_wait(self, outcome: Outcome, attempt: int) -> float | None:
        """Seconds before the attempt after `attempt` (0 the first) within a request, or None when
        none is made; the caller sees that it fits before the request's deadline."""
        if outcome.pause_channel:  # the channel's own pause (delay_seconds) is the queue's, not ours
            if attempt + 1 >= self.paused_tries:
                return None
            paused = outcome.retry_after
            wait = paused if paused is not None else self.paused_base_seconds * 2**attempt
        else:
            wait = outcome.delay_seconds or self.in_request[min(attempt, len(self.in_request) - 1)]
        return max(wait, self.floor_seconds)

    @property
    def in_request_attempts(self) -> int:
        """Attempts within a request at most: the first, and one after each wait of `in_request`."""
        return len(self.in_request) + 1
