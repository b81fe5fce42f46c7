"""Per-destination fairness: a bound on attempts in flight to one host, and a breaker.

Anyone can register a webhook, so one host must not take a channel's whole concurrency: at
most `max_in_flight` attempts go to a host at once, and a host that timed out or refused the
connection `failures_to_open` times in a row is parked for a while (doubling while it stays
down, up to a cap). An attempt turned away is deferred: the caller queues it again for later
without spending an attempt; nothing here waits.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

FAILURES_TO_OPEN = 5
OPEN_SECONDS = 30.0
MAX_OPEN_SECONDS = 300.0
# A host at its bound is tried again after about this long (jittered).
BUSY_DEFER_SECONDS = 1.0
PRUNE_SECONDS = 60.0


@dataclass(slots=True)
class _Host:
    in_flight: int = 0
    failures: int = 0  # timeouts or refused connections in a row
    open_until: float = 0.0
    open_seconds: float = 0.0  # the last parking period, doubled when a probe fails


class HostGuard:
    def __init__(
        self,
        max_in_flight: int,
        *,
        failures_to_open: int = FAILURES_TO_OPEN,
        open_seconds: float = OPEN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.failures_to_open = failures_to_open
        self.open_seconds = open_seconds
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._next_prune = 0.0

    def admit(self, host: str) -> float | None:
        """None: the attempt may go (a slot is taken; `release` it). Otherwise the seconds after
        which to try again (see `is_parked` for why)."""
        now = self._clock()
        if now >= self._next_prune:
            self._prune(now)
        state = self._hosts.setdefault(host, _Host())
        if state.open_until > now:
            return state.open_until - now + random.random()
        if state.in_flight >= self.max_in_flight or (state.open_seconds and state.in_flight):
            # At its bound, or parked until now: while one probe is out, the others wait for it.
            return BUSY_DEFER_SECONDS * (0.5 + random.random())
        state.in_flight += 1
        return None

    def release(self, host: str, *, unreachable: bool) -> bool:
        """End an admitted attempt; `unreachable`: it timed out or its connection failed. True when
        this parks the host."""
        state = self._hosts[host]
        state.in_flight -= 1
        if not unreachable:
            state.failures, state.open_seconds = 0, 0.0
            self._forget_if_idle(host, state)
            return False
        state.failures += 1
        if state.failures < self.failures_to_open and not state.open_seconds:
            return False
        state.open_seconds = min(MAX_OPEN_SECONDS, state.open_seconds * 2 or self.open_seconds)
        state.open_until = self._clock() + state.open_seconds
        return True

    def _forget_if_idle(self, host: str, state: _Host) -> None:
        if state.in_flight == 0:
            del self._hosts[host]  # the table holds only hosts in use or parked

    def is_parked(self, host: str) -> bool:
        """Whether the host is parked by its breaker (or waiting for its probe), not just busy."""
        state = self._hosts.get(host)
        return state is not None and bool(state.open_seconds)

    def _prune(self, now: float) -> None:
        """Forget hosts idle and unparked for a while: registered hosts are many, and hostile."""
        stale = now - MAX_OPEN_SECONDS
        self._hosts = {h: s for h, s in self._hosts.items() if s.in_flight or s.open_until > stale}
        self._next_prune = now + PRUNE_SECONDS

    def parked(self) -> int:
        now = self._clock()
        return sum(1 for state in self._hosts.values() if state.open_until > now)
