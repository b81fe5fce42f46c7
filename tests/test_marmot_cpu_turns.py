"""The handlers' CPU work runs in turns: pieces in arrival order, a slice of them per event-loop
iteration, so the relay readers sharing the loop are polled between two slices."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator

import pytest

from app.delivery.registry import ProviderRegistry
from app.marmot import secp
from app.marmot.admission import Dedup, Tier
from app.marmot.cpu_turns import CpuTurns
from app.marmot.giftwrap import wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, encrypt_token
from app.marmot.triggers import Limits, TriggerHandler, TriggerResult


@contextlib.contextmanager
def loop_iterations() -> Iterator[list[int]]:
    """[n]: the event loop's iterations counted so far (a callback that reschedules itself runs once
    in each)."""
    loop, counted = asyncio.get_running_loop(), [0]

    def tick() -> None:
        counted[0] += 1
        handle[0] = loop.call_soon(tick)

    handle = [loop.call_soon(tick)]
    try:
        yield counted
    finally:
        handle[0].cancel()


class Clock:
    """Time that moves only when a piece of work says it took some."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_pieces_run_in_arrival_order_each_in_an_iteration_of_its_own_with_no_slice() -> None:
    turns, ran = CpuTurns(slice_seconds=0.0), []

    def piece(name: str, iterations: list[int]) -> str:
        ran.append((name, iterations[0]))
        return name

    with loop_iterations() as iterations:
        called = iterations[0]
        pieces = [turns.run(functools.partial(piece, name, iterations)) for name in "abcd"]
        assert await asyncio.gather(*pieces) == list("abcd")
    assert [name for name, _ in ran] == list("abcd")
    started = [iteration for _, iteration in ran]
    assert called < started[0] and started == sorted(set(started))


async def test_a_slice_runs_pieces_until_its_time_is_spent_then_the_loop_polls() -> None:
    clock, ran = Clock(), []
    turns = CpuTurns(slice_seconds=1.0, clock=clock)

    def piece(name: str, iterations: list[int]) -> None:
        clock.now += 0.4  # the third piece of a slice crosses its end: the fourth waits
        ran.append((name, iterations[0]))

    with loop_iterations() as iterations:
        await asyncio.gather(*(turns.run(functools.partial(piece, name, iterations)) for name in "abcdef"))
    slices = [iteration for _, iteration in ran]
    assert [name for name, _ in ran] == list("abcdef")
    assert slices[0] == slices[1] == slices[2] < slices[3] == slices[4] == slices[5]


async def test_a_piece_that_fails_fails_its_caller_only_and_a_cancelled_callers_piece_is_skipped() -> None:
    turns, ran = CpuTurns(slice_seconds=0.0), []

    def fail() -> None:
        raise ValueError("a bug")

    failing = asyncio.ensure_future(turns.run(fail))
    cancelled = asyncio.ensure_future(turns.run(lambda: ran.append("cancelled")))
    last = asyncio.ensure_future(turns.run(lambda: ran.append("last")))
    await asyncio.sleep(0)  # all three queued
    cancelled.cancel()
    with pytest.raises(ValueError, match="a bug"):
        await failing
    await last
    assert ran == ["last"] and cancelled.cancelled()


async def test_the_same_wrap_handled_twice_at_once_is_unwrapped_and_charged_once() -> None:
    key = ServerKey(secp.fresh_secret())
    one = Tier(1, 1)  # a second charge of the global budget would be refused
    handler = TriggerHandler(key, ProviderRegistry(), Dedup(300.0), Limits(one, one, one), 1)
    wrap = wrap_trigger(encrypt_token(key.public_x, Platform.APNS, "ab" * 32), key.public_x)
    results = await asyncio.gather(handler.handle(wrap), handler.handle(wrap))  # two relays at once
    assert results == [TriggerResult.ACCEPTED, TriggerResult.DUPLICATE]
