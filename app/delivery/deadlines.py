"""Time bounds for many concurrent attempts, kept by one periodic sweep.

A timer per attempt (aiohttp's per-request timeout, or `asyncio.timeout`) costs a
timer handle scheduled and cancelled on the event loop each time: about 9 us of
a webhook post's 96 us on a 2-core machine. Here an attempt only records its
deadline; a sweep a few times a second cancels the tasks past theirs, and the
attempt sees a `TimeoutError`, as with `asyncio.timeout`. A bound is kept to
within one sweep period: a tenth of the bound at most, unless given.

An attempt is bounded by the instance's `seconds` from its start, or by a deadline of its own
(`bound(until=...)`, on the time.monotonic() clock: a Matrix request's time left). A task is under
one bound of an instance at a time; bounds of two instances may nest (the earlier one wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from types import TracebackType

MAX_SWEEP_SECONDS = 0.1


class Deadlines:
    """`with deadlines.bound():` around an await limits it to `seconds` (from the event loop's task)."""

    def __init__(self, seconds: float, period: float | None = None) -> None:
        self.seconds = seconds
        self.period = period if period is not None else min(MAX_SWEEP_SECONDS, seconds / 10)
        self._running: dict[asyncio.Task[object], float] = {}  # task -> monotonic deadline
        self._expired: set[asyncio.Task[object]] = set()  # cancelled by the sweep, not yet told
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bound(self, until: float | None = None) -> Bound:
        # The loop is looked up once: on Python 3.11 each lookup without it makes a getpid() system
        # call, and profiles of a busy worker showed those calls (their real share was not measured).
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._sweeper = self._loop.create_task(self._sweep())
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("a deadline needs a running task")
        return Bound(self, task, until)

    def _enter(self, task: asyncio.Task[object], until: float | None) -> None:
        self._running[task] = until if until is not None else time.monotonic() + self.seconds

    def _exit(self, task: asyncio.Task[object], cancelled: bool) -> bool:
        """True when the sweep cancelled the task and no one else did: a timeout, not a cancellation."""
        del self._running[task]
        if task not in self._expired:
            return False
        self._expired.discard(task)
        # Withdrawn even when the cancellation did not come out as one (caught and turned into
        # another error on the way), so the task's count of cancellation requests stays balanced.
        remaining = task.uncancel()
        return cancelled and remaining == 0

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Cancel the attempts whose deadline is `now` or earlier, as timed out."""
        for task, deadline in self._running.items():
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()

    async def close(self) -> None:
        # Attempts still running would lose their bound with the sweep: they time out now instead.
        self._expire(math.inf)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = self._loop = None


class Bound:
    """One attempt's bound; a small class rather than a generator-based context manager, which would
    build and drive a generator on every attempt."""

    __slots__ = ("_deadlines", "_task", "_until")

    def __init__(self, deadlines: Deadlines, task: asyncio.Task[object], until: float | None) -> None:
        self._deadlines = deadlines
        self._task = task
        self._until = until

    def __enter__(self) -> None:
        self._deadlines._enter(self._task, self._until)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._deadlines._exit(self._task, kind is asyncio.CancelledError):
            raise TimeoutError from error
