"""HostGuard: a slow host gets at most N attempts in flight, and a breaker parks hosts that do not answer."""

from __future__ import annotations

import pytest

from app.delivery import host_guard
from app.delivery.host_guard import Change, HostGuard
from app.delivery.retry import Retry, next_step
from app.delivery.types import Outcome, OutcomeKind, deferred
from app.fanout.delivery_job import DeliveryJob


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_host_not_yet_shown_fast_takes_at_most_its_bound_and_others_are_not_affected() -> None:
    guard = HostGuard(2, clock=Clock())
    assert guard.admit("a:443") is None and guard.admit("a:443") is None
    wait = guard.admit("a:443")
    assert wait is not None and 0.125 <= wait < 0.375  # soon: its speed is not known yet
    assert not guard.is_parked("a:443")  # busy, not parked
    assert guard.admit("b:443") is None  # another host has its own bound
    guard.release("a:443", unreachable=False, seconds=4.0)
    assert guard.admit("a:443") is None
    wait = guard.admit("a:443")
    assert wait is not None and 2.0 <= wait < 6.0  # about one of its slow attempts


def test_a_host_that_answers_fast_takes_its_fast_bound_and_its_slow_one_again_when_it_slows() -> None:
    guard = HostGuard(2, max_fast_in_flight=64, clock=Clock())
    assert guard.admit("relay:443") is None
    guard.release("relay:443", unreachable=False, seconds=0.02)
    # An app's own relay keeps its speed; a victim's fast server does not take the channel's 256.
    assert [guard.admit("relay:443") for _ in range(64)] == [None] * 64
    wait = guard.admit("relay:443")
    assert wait is not None and wait < 0.375 and not guard.is_parked("relay:443")
    for _ in range(64):
        guard.release("relay:443", unreachable=False, seconds=8.0)  # it slows down
    assert guard.admit("relay:443") is None and guard.admit("relay:443") is None
    assert guard.admit("relay:443") is not None


def test_repeated_timeouts_park_the_host_then_one_probe_decides() -> None:
    clock = Clock()
    guard = HostGuard(16, failures_to_open=3, open_seconds=30.0, clock=clock)
    for n in range(3):
        assert guard.admit("dead:443") is None
        # parks on the third
        assert guard.release("dead:443", unreachable=True, seconds=10.0) is (
            Change.PARKED if n == 2 else None
        )
    assert guard.parked() == 1 and guard.is_parked("dead:443") and not guard.is_parked("other:443")
    wait = guard.admit("dead:443")
    assert wait is not None and 30.0 <= wait < 31.0
    clock.now += 31
    assert guard.admit("dead:443") is None  # the probe
    assert guard.admit("dead:443") is not None  # the others wait for it
    # The probe failed: twice as long, and no change to tell (it was parked, it stays parked).
    assert guard.release("dead:443", unreachable=True, seconds=10.0) is None
    wait = guard.admit("dead:443")
    assert wait is not None and 60.0 <= wait < 61.0
    clock.now += 61
    assert guard.admit("dead:443") is None
    assert guard.release("dead:443", unreachable=False, seconds=0.05) is Change.UNPARKED  # answered
    assert guard.parked() == 0 and not guard.is_parked("dead:443")


def test_attempts_already_in_flight_when_a_host_parks_change_nothing_more() -> None:
    guard = HostGuard(16, failures_to_open=5, clock=Clock())
    assert [guard.admit("dead:443") for _ in range(16)] == [None] * 16
    changes = [guard.release("dead:443", unreachable=True, seconds=10.0) for _ in range(16)]
    assert changes.count(Change.PARKED) == 1 and changes.count(None) == 15


def test_the_fast_bound_is_never_below_the_slow_one() -> None:
    assert HostGuard(100, max_fast_in_flight=64).max_fast_in_flight == 100


def test_parking_is_capped_and_idle_hosts_are_forgotten() -> None:
    clock = Clock()
    guard = HostGuard(1, failures_to_open=1, open_seconds=100.0, clock=clock)
    for _ in range(5):
        clock.now += host_guard.MAX_OPEN_SECONDS + 1
        assert guard.admit("h:80") is None
        guard.release("h:80", unreachable=True, seconds=10.0)
    wait = guard.admit("h:80")
    assert wait is not None and wait <= host_guard.MAX_OPEN_SECONDS + 1
    for n in range(100):
        assert guard.admit(f"ok{n}:443") is None
        guard.release(f"ok{n}:443", unreachable=False, seconds=0.01)
    clock.now += host_guard.MAX_OPEN_SECONDS + host_guard.IDLE_SECONDS + host_guard.PRUNE_SECONDS
    guard.admit("x:443")
    assert list(guard._hosts) == ["x:443"]  # only the host in use now


def job(attempt: int = 1) -> DeliveryJob:
    return DeliveryJob(b"r" * 32, b"\x00" + b"t" * 16, 7, 0, attempt)


@pytest.mark.parametrize("attempt", [1, 5, 15])
def test_a_deferred_push_is_queued_again_without_spending_an_attempt(attempt: int) -> None:
    busy = deferred(2.0, replaceable=False)
    step = next_step(job(attempt), busy, 15, 1.0, window_seconds=3600.0, age_seconds=10.0)
    assert isinstance(step, Retry) and step.job == job(attempt) and step.delay_seconds == 2.0
    late = next_step(job(attempt), busy, 15, 1.0, window_seconds=3600.0, age_seconds=3599.0)
    assert late == Outcome(OutcomeKind.FAILED)  # the window is over: counted as failed
