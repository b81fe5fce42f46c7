"""A channel's retry policy: the queue's schedule and window from the retry settings, the in-request
waits the Matrix gateway uses, and the floor under both."""

from __future__ import annotations

from app.core.channels import Channel
from app.core.config import Settings
from app.delivery.registry import CHANNELS
from app.delivery.retry import Retry, RetryPolicy
from app.delivery.types import Outcome, OutcomeKind
from app.fanout.delivery_job import DeliveryJob

FAILED = Outcome(OutcomeKind.FAILED)
QUOTA = Outcome(OutcomeKind.FAILED, delay_seconds=30.0, pause_channel=True)


def job() -> DeliveryJob:
    return DeliveryJob(b"\x01" * 32, b"topic", 7, 0)


def test_the_retry_settings_make_every_channels_queued_schedule_and_window() -> None:
    settings = Settings(retry_base_seconds=2.0, max_attempts=4, retry_window_seconds=90.0)
    for descriptor in CHANNELS.values():
        policy = descriptor.retry.configured(settings)
        assert (policy.base_seconds, policy.max_attempts, policy.window_seconds) == (2.0, 4, 90.0)
        assert policy.in_request == descriptor.retry.in_request
    # The settings' defaults are the policy's own.
    assert RetryPolicy().configured(Settings()) == RetryPolicy()


def test_the_in_request_schedule_waits_short_then_gives_up_on_a_quota() -> None:
    policy = RetryPolicy()
    assert [policy.in_request_wait(FAILED, n) for n in range(5)] == [0.2, 0.5, 1.0, 2.0, 2.0]
    assert policy.in_request_attempts == 5
    assert policy.in_request_wait(Outcome(OutcomeKind.FAILED, delay_seconds=3.0), 0) == 3.0
    assert [policy.in_request_wait(QUOTA, n) for n in range(3)] == [60.0, 120.0, None]
    told = Outcome(OutcomeKind.FAILED, pause_channel=True, retry_after=5.0)
    assert policy.in_request_wait(told, 0) == 5.0


def test_the_floor_holds_every_retry_back_but_not_a_deferred_push() -> None:
    policy = RetryPolicy(base_seconds=1.0, floor_seconds=10.0)
    step = policy.next_step(job(), FAILED, age_seconds=0.0)
    assert isinstance(step, Retry) and step.delay_seconds == 10.0
    assert policy.in_request_wait(FAILED, 0) == 10.0
    deferred = policy.next_step(job(), Outcome(OutcomeKind.DEFERRED, delay_seconds=0.5), age_seconds=0.0)
    assert isinstance(deferred, Retry) and deferred.delay_seconds == 0.5
    unfloored = RetryPolicy(base_seconds=1.0).next_step(job(), FAILED, age_seconds=0.0)
    assert isinstance(unfloored, Retry) and unfloored.delay_seconds < 1.5


def test_fcm_retries_no_sooner_than_ten_seconds_or_its_retry_after_when_longer() -> None:
    # docs/hints.md#outcomes-retries-and-cleanup: FCM's floor holds under the shortest retry settings.
    settings = Settings(retry_base_seconds=0.05)
    fcm = CHANNELS[Channel.FCM].retry.configured(settings)
    step = fcm.next_step(job(), FAILED, age_seconds=0.0)
    assert isinstance(step, Retry) and step.delay_seconds == 10.0
    told = fcm.next_step(job(), Outcome(OutcomeKind.FAILED, delay_seconds=42.0), age_seconds=0.0)
    assert isinstance(told, Retry) and told.delay_seconds == 42.0
    # The other channels keep the settings' schedule.
    for channel, descriptor in CHANNELS.items():
        if channel is not Channel.FCM:
            other = descriptor.retry.configured(settings).next_step(job(), FAILED, age_seconds=0.0)
            assert isinstance(other, Retry) and other.delay_seconds < 0.1, channel
