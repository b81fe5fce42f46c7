"""Live triggers waiting for a handler: one bounded buffer for every relay connection of the process,
taken in arrival order by a fixed number of handlers (MARMOT_MAX_CONCURRENT).

A relay does not wait for a subscriber that stops reading (rust-nostr's LocalRelay drops the live events
it falls behind on), so a relay's reader never waits for a handler: it offers each trigger and reads on.
A full buffer refuses the trigger without any work, counted as rate limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from app.core import metrics
from app.marmot.triggers import TriggerResult, count_trigger

log = logging.getLogger("app.marmot.pending")

# A full buffer is logged at most this often (it may stay full through a flood).
FULL_LOG_SECONDS = 60.0


class TriggerSink(Protocol):
    async def handle(self, event: dict[str, Any]) -> object: ...


class PendingTriggers:
    """The buffer and its handlers; `offer` never waits."""

    def __init__(self, sink: TriggerSink, handlers: int, limit: int) -> None:
        self._sink, self._handlers = sink, handlers
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(limit)
        self._refused = 0  # since the last log line
        self._logged_at = -FULL_LOG_SECONDS

    def offer(self, event: dict[str, Any]) -> bool:
        """Buffer a live trigger; False (counted, logged now and then) when the buffer is full."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            count_trigger(TriggerResult.RATE_LIMITED)
            self._note_full()
            return False
        metrics.marmot_pending.inc()
        return True

    @contextlib.asynccontextmanager
    async def serving(self, grace: float) -> AsyncIterator[None]:
        """The handlers, for the block's duration; on the way out the triggers still buffered or in
        flight get `grace` seconds to finish, and whatever is left then is dropped."""
        tasks = [asyncio.create_task(self._handle_in_turn()) for _ in range(self._handlers)]
        try:
            yield
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), grace)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._drop_left()

    async def _handle_in_turn(self) -> None:
        while True:
            event = await self._queue.get()
            metrics.marmot_pending.dec()
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
                "pending triggers full (%d): live triggers refused, %d since this was last logged",
                self._queue.maxsize,
                self._refused,
            )
            self._logged_at, self._refused = now, 0

    def _drop_left(self) -> None:
        left = self._queue.qsize()
        if left:
            log.info("%d pending trigger(s) dropped on the way out", left)
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()
            metrics.marmot_pending.dec()
