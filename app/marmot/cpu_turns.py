"""The handlers' CPU work, run in turns: a slice of it per event-loop iteration.

The relay readers share the event loop with the trigger handlers, whose unwrapping and token decryption
are synchronous CPU work (~0.5 ms for a one-token trigger, a few ms for 32 tokens). Left alone, every
handler ready to run does that work in the same loop iteration (64 handlers: tens of milliseconds)
before the loop polls its sockets again; a reader that slow falls behind, and a relay drops the live
events a subscriber falls behind on. Here the handlers hand that work over and wait for its result: the
pieces run in arrival order, in slices of about SLICE_SECONDS (at least one piece each), one slice per
loop iteration, so the loop polls its sockets between two slices while the I/O around the work (Redis,
pushes) stays concurrent. It is all done in one thread either way; a slice of several small pieces
keeps the loop's own cost (an iteration, a wake-up) per piece low.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# The CPU work run between two polls of the sockets, the piece that crosses it included: about one
# one-token trigger's unwrapping. With 2 ms, a burst of 4,000 triggers at once still lost a few.
SLICE_SECONDS = 0.0005


class CpuTurns:
    """Pieces of synchronous work run in arrival order, one slice of them per loop iteration."""

    def __init__(
        self, slice_seconds: float = SLICE_SECONDS, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._slice, self._clock = slice_seconds, clock
        self._waiting: deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = deque()
        self._scheduled = False

    async def run(self, work: Callable[[], T]) -> T:
        """`work()`'s result (or its exception), once its turn came in a later loop iteration."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._waiting.append((work, done))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._run_slice)
        return await done

    def _run_slice(self) -> None:
        ends = self._clock() + self._slice
        try:
            while self._waiting:
                work, done = self._waiting.popleft()
                if not done.cancelled():  # else its caller is gone: nothing to do
                    _settle(done, work)
                if self._clock() >= ends:
                    break
        finally:  # whatever happened, the pieces still waiting get their turn
            self._scheduled = bool(self._waiting)
            if self._scheduled:  # once the loop has polled its sockets
                asyncio.get_running_loop().call_soon(self._run_slice)


def _settle(done: asyncio.Future[Any], work: Callable[[], Any]) -> None:
    try:
        done.set_result(work())
    except Exception as error:  # the caller's to handle
        done.set_exception(error)
