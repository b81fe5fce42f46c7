"""The gateway's deadline sweep: a late attempt gives None within the sweep's lateness; a
cancellation that is not the deadline's goes on; a task that met its deadline is left uncancelled."""

from __future__ import annotations

import asyncio

import pytest

from app.matrix.deadlines import SWEEP_SECONDS, Deadlines


async def test_an_attempt_past_its_deadline_gives_none_within_the_sweep() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.1
    result = await deadlines.within(deadline, asyncio.sleep(5, "late"))
    assert result is None
    assert deadline <= loop.time() < deadline + SWEEP_SECONDS + 0.05
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_an_attempt_in_time_gives_its_result_and_the_sweep_stops() -> None:
    deadlines = Deadlines()
    deadline = asyncio.get_running_loop().time() + 5
    assert await deadlines.within(deadline, asyncio.sleep(0.01, "answer")) == "answer"
    await asyncio.sleep(SWEEP_SECONDS * 3)
    assert deadlines._sweeper is None  # nothing watched: no wake-ups


async def test_another_cancellation_is_not_taken_for_the_deadline() -> None:
    deadlines = Deadlines()
    deadline = asyncio.get_running_loop().time() + 5
    task = asyncio.create_task(deadlines.within(deadline, asyncio.sleep(5)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_concurrent_attempts_each_keep_their_own_deadline() -> None:
    deadlines = Deadlines()
    now = asyncio.get_running_loop().time()
    early = deadlines.within(now + 0.05, asyncio.sleep(1, "early"))
    late = deadlines.within(now + 5, asyncio.sleep(0.2, "late"))
    assert await asyncio.gather(early, late) == [None, "late"]
