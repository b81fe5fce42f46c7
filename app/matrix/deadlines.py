"""Request deadlines kept by one sweep, not a timer per attempt.

Every device of every notify request waits on its provider under the request's deadline. An
`asyncio.timeout` per attempt makes and cancels a timer handle each time, a few percent of a
one-device request's CPU; here a watched task costs a dict entry, and one sweep every
SWEEP_SECONDS cancels the tasks whose deadline has passed. A deadline is therefore kept to within
SWEEP_SECONDS, which the caller allows for in its margin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

SWEEP_SECONDS = 0.02

T = TypeVar("T")


class Deadlines:
    def __init__(self) -> None:
        self._watched: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def within(self, deadline: float, awaitable: Awaitable[T]) -> T | None:
        """`awaitable`'s result, or None once the event loop's time reaches `deadline`."""
        task = asyncio.current_task()
        assert task is not None
        self._watched[task] = deadline
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            return None  # ours: the deadline passed; any other cancellation goes on
        finally:
            del self._watched[task]
            if task in self._expired:
                self._expired.discard(task)
                task.uncancel()

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watched:
            await asyncio.sleep(SWEEP_SECONDS)
            now = loop.time()
            for task, deadline in self._watched.items():
                if deadline <= now and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
        self._sweeper = None
