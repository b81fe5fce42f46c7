"""Per-destination fairness: a bound on a slow host's attempts in flight, and a breaker.

Anyone can register a webhook, so one host must not take a channel's whole concurrency. What
holds slots is time: a host that answers quickly frees its slots as fast as it takes them (an
app's own push relay may receive every push of the app), while one that hangs keeps them for the
whole timeout. So a host gets at most `max_in_flight` attempts at once until its answers have
shown it fast (an average under SLOW_SECONDS), and again whenever they stop showing it; a fast one
at most `max_fast_in_flight`, so that a fast server someone else registered (a victim's) does not
take the channel's whole concurrency either, while an app's own relay keeps its speed. A host
that timed out or refused the connection `failures_to_open` times in a row is parked for a while
(doubling while it stays down, up to a cap; then one probe decides). An attempt turned away is
deferred: the caller queues it again for later without spending an attempt; nothing here waits.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.core.quota_settings import MAX_PER_FAST_HOST

FAILURES_TO_OPEN = 5
OPEN_SECONDS = 30.0
MAX_OPEN_SECONDS = 300.0
# A host whose attempts take longer than this on average is bounded.
SLOW_SECONDS = 1.0
# How much one attempt moves a host's average duration.
LATENCY_WEIGHT = 0.2
# A host at its bound is tried again after about its average attempt's duration, within these
# (jittered): soon while it has not shown its speed, seldom once it has shown it slow.
MIN_DEFER_SECONDS, MAX_DEFER_SECONDS = 0.25, 5.0
# Hosts idle this long (and not parked) are forgotten: registered hosts are many, and hostile.
IDLE_SECONDS = 120.0
PRUNE_SECONDS = 60.0


class Change(enum.Enum):
    """A host's change of state that an attempt's end brought, told once (not per attempt)."""

    PARKED = "parked"
    UNPARKED = "unparked"


@dataclass(slots=True)
class _Host:
    in_flight: int = 0
    latency: float | None = None  # average attempt duration; None: not shown yet
    failures: int = 0  # timeouts or refused connections in a row
    open_until: float = 0.0
    open_seconds: float = 0.0  # the last parking period, doubled when a probe fails
    last_used: float = 0.0


def _busy_delay(state: _Host) -> float:
    typical = min(MAX_DEFER_SECONDS, max(MIN_DEFER_SECONDS, state.latency or 0.0))
    return typical * (0.5 + random.random())


class HostGuard:
    def __init__(
        self,
        max_in_flight: int,
        *,
        max_fast_in_flight: int = MAX_PER_FAST_HOST,
        failures_to_open: int = FAILURES_TO_OPEN,
        open_seconds: float = OPEN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_fast_in_flight = max(max_in_flight, max_fast_in_flight)
        self.failures_to_open = failures_to_open
        self.open_seconds = open_seconds
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._next_prune = 0.0

    def admit(self, host: str) -> float | None:
        """None: the attempt may go (a slot is taken; `release` it). Otherwise the seconds after
        which to try again (`is_parked` tells why)."""
        now = self._clock()
        if now >= self._next_prune:
            self._prune(now)
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _Host()
        state.last_used = now
        if state.open_until > now:
            return state.open_until - now + random.random()
        if state.open_seconds and state.in_flight:
            return _busy_delay(state)  # one probe decides for the others
        if state.in_flight >= self.max_in_flight and (state.latency is None or state.latency >= SLOW_SECONDS):
            return _busy_delay(state)
        if state.in_flight >= self.max_fast_in_flight:
            return _busy_delay(state)
        state.in_flight += 1
        return None

    def release(self, host: str, *, unreachable: bool, seconds: float) -> Change | None:
        """End an admitted attempt that took `seconds`; `unreachable`: it timed out or its
        connection failed. Says when this parks the host, or un-parks it (an answer at last); a
        parked host's probe failing again keeps it parked, longer, and is no change."""
        state = self._hosts[host]
        state.in_flight -= 1
        state.latency = (
            seconds if state.latency is None else state.latency + LATENCY_WEIGHT * (seconds - state.latency)
        )
        was_parked = bool(state.open_seconds)
        if not unreachable:
            state.failures, state.open_seconds = 0, 0.0
            return Change.UNPARKED if was_parked else None
        state.failures += 1
        if state.failures < self.failures_to_open and not was_parked:
            return None
        state.open_seconds = min(MAX_OPEN_SECONDS, state.open_seconds * 2 or self.open_seconds)
        state.open_until = self._clock() + state.open_seconds
        return None if was_parked else Change.PARKED

    def is_parked(self, host: str) -> bool:
        """Whether the host is parked by its breaker (or waiting for its probe), not just busy."""
        state = self._hosts.get(host)
        return state is not None and bool(state.open_seconds)

    def parked(self) -> int:
        now = self._clock()
        return sum(1 for state in self._hosts.values() if state.open_until > now)

    def _prune(self, now: float) -> None:
        idle = now - IDLE_SECONDS
        self._hosts = {
            host: state
            for host, state in self._hosts.items()
            if state.in_flight or state.open_until > now or state.last_used > idle
        }
        self._next_prune = now + PRUNE_SECONDS
