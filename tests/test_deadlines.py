"""The shared-sweep time bound that webhook posts run under."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.delivery.deadlines import Deadlines


async def _bounded_sleep(deadlines: Deadlines, seconds: float) -> str:
    with deadlines.bound():
        await asyncio.sleep(seconds)
    return "finished"


async def test_an_attempt_past_its_bound_gets_a_timeout_error_within_one_sweep() -> None:
    deadlines = Deadlines(0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await _bounded_sleep(deadlines, 5)
    elapsed = time.monotonic() - started
    # The bound, one sweep period, and slack for a loaded machine: the fault this guards against
    # runs the 5 s sleep out.
    assert 0.3 <= elapsed < 0.3 + 0.03 + 0.5, elapsed
    await deadlines.close()


async def test_an_attempt_within_its_bound_is_untouched_and_the_task_can_be_cancelled_later() -> None:
    deadlines = Deadlines(0.2)
    assert await _bounded_sleep(deadlines, 0.01) == "finished"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.3)  # past where the deadline would have been: nothing fires
    await deadlines.close()


async def test_one_task_runs_bounded_attempts_one_after_another() -> None:
    # As a delivery slot does: a timed-out attempt leaves nothing behind for the next one.
    deadlines = Deadlines(0.3)
    with pytest.raises(TimeoutError):
        await _bounded_sleep(deadlines, 1)
    assert await _bounded_sleep(deadlines, 0.01) == "finished"
    with pytest.raises(TimeoutError):
        await _bounded_sleep(deadlines, 1)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await deadlines.close()


async def test_many_concurrent_attempts_time_out_only_where_slow() -> None:
    deadlines = Deadlines(0.2)
    results = await asyncio.gather(
        *(_bounded_sleep(deadlines, 0.01 if n % 2 else 3) for n in range(200)), return_exceptions=True
    )
    assert all(r == "finished" for r in results[1::2])
    assert all(isinstance(r, TimeoutError) for r in results[0::2])
    await deadlines.close()


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    deadlines = Deadlines(10)
    task = asyncio.create_task(_bounded_sleep(deadlines, 5))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await deadlines.close()


async def test_a_cancellation_from_outside_at_the_deadline_is_not_swallowed() -> None:
    deadlines = Deadlines(10)
    task = asyncio.create_task(_bounded_sleep(deadlines, 5))
    await asyncio.sleep(0.01)
    # The sweep and someone else cancel the task before it runs again: what the sweep does
    # (mark it expired, cancel it), done here so that both land in the same loop iteration.
    deadlines._expired.add(task)
    task.cancel()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await deadlines.close()


async def test_a_bound_needs_a_task() -> None:
    deadlines = Deadlines(1)
    loop = asyncio.get_running_loop()
    said: asyncio.Future[str] = loop.create_future()

    def outside_any_task() -> None:
        try:
            deadlines.bound()
        except RuntimeError as error:
            said.set_result(str(error))
        else:
            said.set_result("no error")

    loop.call_soon(outside_any_task)
    assert await said == "a deadline needs a running task"


async def test_an_attempt_with_a_deadline_of_its_own_keeps_that_one() -> None:
    # A Matrix request's time left: its deadline, not the instance's bound from now.
    deadlines = Deadlines(5, period=0.02)
    until = time.monotonic() + 0.1
    with pytest.raises(TimeoutError), deadlines.bound(until=until):
        await asyncio.sleep(5)
    timed_out = time.monotonic()
    assert until <= timed_out < until + 0.02 + 0.5, timed_out - until  # period, slack; not the 5 s
    await deadlines.close()


async def test_bounds_of_two_instances_nest_and_the_earlier_one_wins() -> None:
    # The gateway's request deadline around the APNs provider's own bound, on one task.
    outer, inner = Deadlines(5, period=0.02), Deadlines(5, period=0.02)
    for outer_s, inner_s, sleep_s, expected in (
        (0.05, 5, 1, "timeout"),
        (5, 0.05, 1, "timeout"),
        (5, 5, 0.01, "ok"),
    ):
        now = time.monotonic()
        try:
            with outer.bound(until=now + outer_s), inner.bound(until=now + inner_s):
                await asyncio.sleep(sleep_s)
            got = "ok"
        except TimeoutError:
            got = "timeout"
        assert got == expected
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
    await outer.close()
    await inner.close()


async def test_closing_ends_the_attempts_still_running_as_timed_out_rather_than_unbounded() -> None:
    # A provider closed under its attempts (the process stopping) leaves none running without a bound.
    deadlines = Deadlines(30.0)
    attempt = asyncio.create_task(_bounded_sleep(deadlines, 60))
    await asyncio.sleep(0.05)  # the attempt is under its bound
    await deadlines.close()
    done, _ = await asyncio.wait({attempt}, timeout=1.0)
    assert done == {attempt}, "the attempt outlived its bound's close"
    assert isinstance(attempt.exception(), TimeoutError)
