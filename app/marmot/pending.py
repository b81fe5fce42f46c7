"""Live triggers waiting for a handler: one buffer for every relay connection of the process, bounded
in bytes (MARMOT_PENDING_BYTES), taken in arrival order by a fixed number of handlers
(MARMOT_MAX_CONCURRENT).

A relay does not wait for a subscriber that stops reading (rust-nostr's LocalRelay drops the live events
it falls behind on), so a relay's reader never waits for a handler: it offers each trigger and reads on.
Each trigger is charged about what it holds in memory (the reader passes its frame's length): gift
wraps run from ~5 KiB to ~120 KiB, so a bound in triggers would either hold too few small ones or allow
too much memory for large ones. A trigger that does not fit is refused without any work, counted as
rate limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar

from app.core import metrics
from app.marmot.triggers import TriggerResult, count_trigger

log = logging.getLogger("app.marmot.pending")

# A full buffer is logged at most this often (it may stay full through a flood).
FULL_LOG_SECONDS = 60.0


# What the buffer holds: a relay's event, or a wrap taken from the shared queue (app.marmot.wrap_queue).
T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class TriggerSink(Protocol[T_contra]):
    async def handle(self, event: T_contra, /) -> object: ...


class PendingTriggers(Generic[T]):
    """The buffer and its handlers; `offer` never waits."""

    def __init__(self, sink: TriggerSink[T], handlers: int, budget: int) -> None:
        self._sink, self._handlers, self._budget = sink, handlers, budget
        self._queue: asyncio.Queue[tuple[T, int]] = asyncio.Queue()  # (event, size)
        self._bytes = 0  # the sizes of the triggers buffered
        self._refused = 0  # since the last log line
        self._logged_at = -FULL_LOG_SECONDS

    def offer(self, event: T, size: int) -> bool:
        """Buffer a live trigger charged `size` bytes; False (counted, logged now and then) when the
        buffer has no room for it."""
        if self._bytes + size > self._budget:
            count_trigger(TriggerResult.RATE_LIMITED)
            self._note_full()
            return False
        self._queue.put_nowait((event, size))
        self._bytes += size
        metrics.marmot_pending.inc()
        return True

    @contextlib.asynccontextmanager
    async def serving(self, grace: float) -> AsyncIterator[None]:
        """The handlers, for the block's duration; on the way out the triggers still buffered or in
        flight get `grace` seconds to finish, and whatever is left then is dropped."""
        tasks = [asyncio.create_task(self._handle_in_order()) for _ in range(self._handlers)]
        try:
            yield
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), grace)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._drop_left()

    async def _handle_in_order(self) -> None:
        while True:
            event = self._take(await self._queue.get())
            try:
                await self._sink.handle(event)
            except Exception as error:  # a bug: the next trigger is handled all the same
                log.error("a trigger failed: %s", type(error).__name__)
            finally:
                self._queue.task_done()

    def _note_full(self) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= FULL_LOG_SECONDS:
            log.warning(
                "pending triggers full (%d bytes): live triggers refused, %d since this was last logged",
                self._budget,
                self._refused,
            )
            self._logged_at, self._refused = now, 0

    def _drop_left(self) -> None:
        left = self._queue.qsize()
        if left:
            log.info("%d pending trigger(s) dropped on the way out", left)
        while not self._queue.empty():
            self._take(self._queue.get_nowait())
            self._queue.task_done()

    def _take(self, entry: tuple[T, int]) -> T:
        """A trigger leaving the buffer: its bytes are free again."""
        event, size = entry
        self._bytes -= size
        metrics.marmot_pending.dec()
        return event
