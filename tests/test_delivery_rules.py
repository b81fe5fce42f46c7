"""Delivery rules: retries and final outcomes, backoff, the delivery job's encoding and dedup key,
and the webhook channel's pure parts (status table, exact body, Standard Webhooks signature).

Contract: docs/hints.md#outcomes-retries-and-cleanup, docs/hints.md#the-payload-channel-by-channel and
docs/api.md#webhook-receivers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.delivery.providers.webhook import GONE, outcome_for_status, signed_headers
from app.delivery.retry import MAX_BACKOFF_SECONDS, Retry, backoff, next_step
from app.delivery.types import (
    DEAD,
    DELIVERED,
    FAILED,
    MISMATCH,
    REJECTED,
    Outcome,
    OutcomeKind,
    Priority,
    PushKind,
    WebhookExtras,
)
from app.fanout.delivery_job import DeliveryJob, first_attempts
from app.fanout.hints import Hint, apns_push, fcm_push, webhook_body, webhook_id, webhook_push
from app.recipients.types import Target

RECIPIENT = bytes.fromhex("5a" * 32)
TOPIC = b"\x01" + bytes.fromhex("c0ffee" * 5)
SEQUENCE = 9007199254740993
BASE = 2.0  # backoff base seconds


def job(attempt: int = 1, all_gone: bool = True) -> DeliveryJob:
    return DeliveryJob(RECIPIENT, TOPIC, SEQUENCE, 1_700_000_000_000_000_000, attempt, all_gone)


def run(outcomes: list[Outcome], max_attempts: int) -> tuple[list[Retry], Outcome]:
    """Feed attempt outcomes through next_step until it yields a final outcome."""
    current, retries = job(), list[Retry]()
    for outcome in outcomes:
        step = next_step(current, outcome, max_attempts, BASE)
        if isinstance(step, Outcome):
            return retries, step
        retries.append(step)
        current = step.job
    raise AssertionError(f"no final outcome after {len(outcomes)} attempts")


# ---- next_step -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [DELIVERED, MISMATCH, REJECTED, DEAD])
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_final_outcomes_are_not_retried(outcome: Outcome, attempt: int) -> None:
    assert next_step(job(attempt), outcome, 3, BASE) is outcome


def test_dead_token_is_final_on_the_first_attempt() -> None:
    # APNs 410 / FCM UNREGISTERED: dead right away, no confirmation needed.
    assert next_step(job(), DEAD, 10, BASE) == Outcome(OutcomeKind.DEAD)


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 10])
def test_transient_is_retried_until_max_attempts_then_fails(max_attempts: int) -> None:
    retries, final = run([FAILED] * max_attempts, max_attempts)
    assert len(retries) == max_attempts - 1
    assert [r.job.attempt for r in retries] == list(range(2, max_attempts + 1))
    assert final.kind is OutcomeKind.FAILED
    assert final.kind.value == "failed"


def test_retry_keeps_the_job_identity() -> None:
    step = next_step(job(), FAILED, 3, BASE)
    assert isinstance(step, Retry)
    original = job()
    assert (step.job.recipient_id, step.job.topic, step.job.sequence_id) == (
        original.recipient_id,
        original.topic,
        original.sequence_id,
    )
    assert step.job.ingested_ns == original.ingested_ns


def test_transient_then_delivered() -> None:
    retries, final = run([FAILED, FAILED, DELIVERED], 3)
    assert len(retries) == 2
    assert final is DELIVERED


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5, 30])
def test_gone_is_dead_once_three_attempts_in_a_row_said_so(max_attempts: int) -> None:
    # docs/hints.md: dead once min(max_attempts, 3) attempts in a row answered 404/410.
    retries, final = run([GONE] * max_attempts, max_attempts)
    assert len(retries) == min(max_attempts, 3) - 1
    assert all(r.job.all_gone for r in retries)
    assert final.kind is OutcomeKind.DEAD


def test_retries_stop_when_the_next_would_start_after_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)  # backoff = base * 2^(n-1): 2, 4, 8 ... s
    step = next_step(job(attempt=3), FAILED, 30, BASE, window_seconds=60.0, age_seconds=51.0)
    assert isinstance(step, Retry) and step.delay_seconds == 8.0  # starts at 59 s: inside
    final = next_step(job(attempt=3), FAILED, 30, BASE, window_seconds=60.0, age_seconds=53.0)
    assert final == Outcome(OutcomeKind.FAILED)  # would start at 61 s: the window is over
    quota = Outcome(OutcomeKind.FAILED, delay_seconds=120.0)
    assert next_step(job(), quota, 30, BASE, window_seconds=100.0) == Outcome(OutcomeKind.FAILED)


def test_an_hour_of_transient_failures_is_retried_for_the_whole_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)
    current, age, attempts = job(), 0.0, 1
    while isinstance(step := next_step(current, FAILED, 100, 1.0, 3600.0, age), Retry):
        age += step.delay_seconds
        current, attempts = step.job, attempts + 1
    # 1 + 2 + ... + 256 s, then every 5 minutes: the last attempt falls in the hour's last 5 minutes.
    assert 3300 < age <= 3600
    assert attempts == 20


def test_gone_then_delivered_is_delivered() -> None:
    _, final = run([GONE, DELIVERED], 3)
    assert final is DELIVERED


@pytest.mark.parametrize(
    "attempts",
    [
        [GONE, FAILED, GONE],
        [FAILED, GONE, GONE],
        [GONE, GONE, FAILED],
        [FAILED, FAILED, GONE],
    ],
)
def test_a_transient_among_gone_attempts_means_not_dead(attempts: list[Outcome]) -> None:
    retries, final = run(attempts, 3)
    assert len(retries) == 2
    assert final.kind is OutcomeKind.FAILED


def test_all_gone_flag_survives_encoding_between_attempts() -> None:
    """Retries travel through the queue: the flag must come back out of the payload."""
    current = job()
    for outcome in (GONE, FAILED):
        step = next_step(DeliveryJob.decode(current.encode()), outcome, 3, BASE)
        assert isinstance(step, Retry)
        current = step.job
    final = next_step(DeliveryJob.decode(current.encode()), GONE, 3, BASE)
    assert isinstance(final, Outcome)
    assert final.kind is OutcomeKind.FAILED


def test_provider_delay_is_a_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)  # backoff = 0.5 * base = 1 s
    slow = Outcome(OutcomeKind.FAILED, delay_seconds=120.0)
    step = next_step(job(), slow, 3, BASE)
    assert isinstance(step, Retry)
    assert step.delay_seconds == 120.0


def test_provider_delay_shorter_than_backoff_does_not_shorten_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)  # backoff = base * 2^(n-1)
    step = next_step(job(attempt=3), Outcome(OutcomeKind.FAILED, delay_seconds=0.1), 5, BASE)
    assert isinstance(step, Retry)
    assert step.delay_seconds == BASE * 4


def test_retry_delay_is_at_least_the_provider_delay() -> None:
    for _ in range(200):
        step = next_step(job(attempt=2), Outcome(OutcomeKind.FAILED, delay_seconds=5.0), 3, BASE)
        assert isinstance(step, Retry)
        assert step.delay_seconds >= 5.0  # backoff alone would be 2..6 s


# ---- backoff -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(1, 11))
def test_backoff_stays_within_jitter_bounds(attempt: int) -> None:
    ceiling = min(MAX_BACKOFF_SECONDS, BASE * 2 ** (attempt - 1))
    delays = [backoff(attempt, BASE) for _ in range(300)]
    assert all(0.5 * ceiling <= d < 1.5 * ceiling for d in delays)
    assert len(set(delays)) > 250  # it is really jittered


def test_backoff_jitter_extremes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)
    assert [backoff(n, 1.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    monkeypatch.setattr(random, "random", lambda: 0.999999)
    assert backoff(1, 1.0) == pytest.approx(1.5, abs=1e-5)
    assert backoff(1, 1.0) < 1.5


def test_backoff_grows_exponentially(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)
    assert [backoff(n, 3.0) for n in range(1, 6)] == [3.0, 6.0, 12.0, 24.0, 48.0]


def test_backoff_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.5)
    assert backoff(30, 5.0) == MAX_BACKOFF_SECONDS
    assert backoff(10, 60.0) == MAX_BACKOFF_SECONDS
    monkeypatch.setattr(random, "random", lambda: 0.999999)
    assert backoff(10, 60.0) < 1.5 * MAX_BACKOFF_SECONDS


# ---- DeliveryJob ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "original",
    [
        job(),
        job(attempt=7, all_gone=False),
        DeliveryJob(b"\x00" * 32, b"\x00", 0, 0),
        DeliveryJob(b"\xff" * 32, b"\x05" * 256, 2**64 - 1, 2**63, 10, True),
    ],
)
def test_delivery_job_round_trip(original: DeliveryJob) -> None:
    decoded = DeliveryJob.decode(original.encode())
    assert decoded == original
    assert type(decoded.sequence_id) is int and type(decoded.all_gone) is bool


def _decoded_by_json(payload: bytes) -> DeliveryJob:
    recipient, topic, sequence, ingested, attempt, all_gone = json.loads(payload)
    return DeliveryJob(
        bytes.fromhex(recipient), bytes.fromhex(topic), int(sequence), ingested, attempt, all_gone
    )


def test_delivery_job_decoding_agrees_with_json_on_random_jobs() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        original = DeliveryJob(
            rng.randbytes(rng.choice([0, 1, 32])),
            rng.randbytes(rng.randint(0, 300)),
            rng.randrange(2**64),
            rng.randrange(-(2**63), 2**63),
            rng.randint(1, 10),
            rng.random() < 0.5,
        )
        payload = original.encode()
        assert DeliveryJob.decode(payload) == _decoded_by_json(payload) == original


@pytest.mark.parametrize(
    "payload",
    [
        b'["0123456789abcdef","00ff","0102","5",6,1,true]',  # as earlier versions wrote it
        b'["with, \\"odd\\" chars","00ff","0102","5",6,1,true]',  # an id that needed escaping
        b'[ "00ff", "0102", "5", 6, 1, true ]',  # valid JSON, not as written here
    ],
)
def test_delivery_jobs_queued_by_earlier_versions_or_spaced_still_decode(payload: bytes) -> None:
    assert DeliveryJob.decode(payload) == DeliveryJob(b"\x00\xff", b"\x01\x02", 5, 6, 1, True)


@pytest.mark.parametrize(
    "payload",
    [
        b'["0","00","1",2,1,true]',  # odd-length hex
        b'["00","00","1",2,1]',  # a field short
        b'["00","00","x",2,1,true]',  # sequence not a number
        b"not json",
        b"",
    ],
)
def test_undecodable_delivery_jobs_raise_value_errors(payload: bytes) -> None:
    with pytest.raises(ValueError):
        DeliveryJob.decode(payload)


def test_delivery_job_sequence_id_travels_as_text() -> None:
    fields = json.loads(job().encode())
    assert str(SEQUENCE) in fields


# ---- webhook: status -> outcome ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, OutcomeKind.DELIVERED),
        (201, OutcomeKind.DELIVERED),
        (202, OutcomeKind.DELIVERED),
        (204, OutcomeKind.DELIVERED),
        (299, OutcomeKind.DELIVERED),
        (404, OutcomeKind.DEAD),
        (410, OutcomeKind.DEAD),
        (500, OutcomeKind.FAILED),
        (502, OutcomeKind.FAILED),
        (503, OutcomeKind.FAILED),
        (504, OutcomeKind.FAILED),
        (599, OutcomeKind.FAILED),
        (100, OutcomeKind.REJECTED),
        (301, OutcomeKind.REJECTED),
        (302, OutcomeKind.REJECTED),
        (303, OutcomeKind.REJECTED),
        (307, OutcomeKind.REJECTED),
        (308, OutcomeKind.REJECTED),
        (400, OutcomeKind.REJECTED),
        (401, OutcomeKind.REJECTED),
        (403, OutcomeKind.REJECTED),
        (405, OutcomeKind.REJECTED),
        (413, OutcomeKind.REJECTED),
        (429, OutcomeKind.REJECTED),
        (600, OutcomeKind.REJECTED),
    ],
)
def test_webhook_outcome_for_status(status: int, expected: OutcomeKind) -> None:
    outcome = outcome_for_status(status)
    assert outcome.kind is expected
    # Only 404/410 need confirmation by retry; nothing here pauses the channel.
    assert outcome.confirm_by_retry is (status in (404, 410))
    assert outcome.pause_channel is False


def test_webhook_gone_is_retried_not_final() -> None:
    step = next_step(job(), outcome_for_status(410), 3, BASE)
    assert isinstance(step, Retry)


# ---- webhook: body, id, signature ----------------------------------------------------------------------

VECTOR_KEY = b"\x07" * 32
VECTOR_ID = "fixed-id"
VECTOR_TIMESTAMP = 1700000000
VECTOR_BODY = b'{"topic":"AQID","sequence_id":"9007199254740993","recipient_id":"0101"}'
VECTOR_SIGNATURE = "v1,IszeBLRjxb7spJ5RLi+KW0w/aK3Buioq9E6jl3MKWZw="


def test_webhook_body_matches_the_spec_vector() -> None:
    assert webhook_body(Hint(b"\x01\x02\x03", 9007199254740993, b"\x01\x01")) == VECTOR_BODY


def test_webhook_body_exact_bytes() -> None:
    hint = Hint(b"\xfb\xff", 0, bytes(range(32)))
    expected = (
        b'{"topic":"+/8=","sequence_id":"0","recipient_id":"'
        b'000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"}'
    )
    assert webhook_body(hint) == expected
    assert json.loads(expected) == {
        "topic": "+/8=",
        "sequence_id": "0",
        "recipient_id": bytes(range(32)).hex(),
    }
    assert list(json.loads(webhook_body(hint))) == ["topic", "sequence_id", "recipient_id"]


def test_webhook_body_carries_uint64_sequence_as_text() -> None:
    body = webhook_body(Hint(TOPIC, 2**64 - 1, RECIPIENT))
    assert b'"sequence_id":"18446744073709551615"' in body
    assert b" " not in body


def test_apns_body_is_what_json_dumps_writes_for_the_payload_object() -> None:
    """The APNs body is rendered as text; it must equal what aioapns wrote for the same object."""
    rng = random.Random(7)
    for _ in range(500):
        hint = Hint(rng.randbytes(rng.randint(1, 80)), rng.randrange(2**64), rng.randbytes(32))
        push = apns_push(hint, Target(1, "device", None, b"\x02" * 32))
        topic = base64.b64encode(hint.topic).decode()
        expected = {"aps": {"content-available": 1}, "topic": topic, "sequence_id": str(hint.sequence_id)}
        assert push.payload == json.dumps(expected, ensure_ascii=False).encode()
        assert push.collapse_id == topic


def test_fcm_data_and_webhook_push_fields() -> None:
    hint = Hint(TOPIC, SEQUENCE, RECIPIENT)
    fcm = fcm_push(hint, Target(2, "device", None, b"\x02" * 32))
    assert fcm.payload == {"topic": base64.b64encode(TOPIC).decode(), "sequence_id": str(SEQUENCE)}
    assert (fcm.kind, fcm.priority, fcm.collapse_id) == (PushKind.BACKGROUND, Priority.HIGH, None)
    webhook = webhook_push(hint, Target(3, "https://example.com/h", b"k" * 32, b"\x02" * 32))
    assert (webhook.payload, webhook.message_id) == (webhook_body(hint), webhook_id(hint))
    assert (webhook.address, webhook.extras) == ("https://example.com/h", WebhookExtras(b"k" * 32))


def test_signature_test_vector() -> None:
    headers = signed_headers(VECTOR_KEY, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY)
    assert headers["webhook-signature"] == VECTOR_SIGNATURE
    # And computed by hand, from Standard Webhooks' definition.
    mac = hmac.new(VECTOR_KEY, b"fixed-id.1700000000." + VECTOR_BODY, hashlib.sha256).digest()
    assert "v1," + base64.b64encode(mac).decode() == VECTOR_SIGNATURE


def test_signed_headers_exactly() -> None:
    headers = signed_headers(VECTOR_KEY, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY)
    assert headers == {
        "content-type": "application/json",
        "webhook-id": "fixed-id",
        "webhook-timestamp": "1700000000",
        "webhook-signature": VECTOR_SIGNATURE,
    }


@pytest.mark.parametrize("key_length", [16, 32, 64])
def test_signature_equals_the_standardwebhooks_library(key_length: int) -> None:
    key = bytes(range(1, key_length + 1))
    body = webhook_body(Hint(TOPIC, SEQUENCE, RECIPIENT))
    timestamp = 1_712_345_678
    ours = signed_headers(key, "msg_1", timestamp, body)["webhook-signature"]
    theirs = Webhook(key).sign("msg_1", datetime.fromtimestamp(timestamp, tz=UTC), body.decode())
    assert ours.encode() == theirs.encode()


def test_signature_equals_the_standardwebhooks_library_on_random_inputs() -> None:
    rng = random.Random(20261202)
    for _ in range(2000):
        key = rng.randbytes(rng.randint(16, 64))
        hint = Hint(rng.randbytes(rng.randint(1, 80)), rng.randrange(2**64), rng.randbytes(32))
        body = webhook_body(hint)
        message_id = rng.choice([webhook_id(hint), f"msg_{rng.randrange(10**9)}"])
        timestamp = rng.randrange(0, 2**33)
        ours = signed_headers(key, message_id, timestamp, body)
        theirs = Webhook(key).sign(message_id, datetime.fromtimestamp(timestamp, tz=UTC), body.decode())
        assert ours["webhook-signature"] == theirs
        assert ours["webhook-timestamp"] == str(timestamp)


@pytest.mark.parametrize("key_length", [16, 32, 64])
def test_receivers_verify_our_headers(key_length: int) -> None:
    key = bytes(range(100, 100 + key_length))
    hint = Hint(TOPIC, SEQUENCE, RECIPIENT)
    body = webhook_body(hint)
    headers = signed_headers(key, webhook_id(hint), int(time.time()), body)
    assert Webhook(key).verify(body, headers) == {
        "topic": base64.b64encode(TOPIC).decode(),
        "sequence_id": str(SEQUENCE),
        "recipient_id": RECIPIENT.hex(),
    }


def test_receivers_refuse_a_tampered_body_or_wrong_key() -> None:
    key = b"\x42" * 32
    body = webhook_body(Hint(TOPIC, SEQUENCE, RECIPIENT))
    headers = signed_headers(key, "id", int(time.time()), body)
    with pytest.raises(WebhookVerificationError):
        Webhook(key).verify(body.replace(b'"sequence_id":"', b'"sequence_id":"1'), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(b"\x43" * 32).verify(body, headers)


def test_webhook_id_is_stable_per_hint() -> None:
    hint = Hint(TOPIC, SEQUENCE, RECIPIENT)
    assert webhook_id(hint) == webhook_id(Hint(TOPIC, SEQUENCE, RECIPIENT))
    assert webhook_id(hint) == webhook_id(job(attempt=3).hint)
    others = {
        webhook_id(Hint(TOPIC, SEQUENCE + 1, RECIPIENT)),
        webhook_id(Hint(TOPIC + b"\x00", SEQUENCE, RECIPIENT)),
        webhook_id(Hint(TOPIC, SEQUENCE, b"\x11" * 32)),
        webhook_id(Hint(TOPIC, 2**64 - 1, RECIPIENT)),
    }
    assert webhook_id(hint) not in others
    assert len(others) == 4
    assert RECIPIENT.hex() not in webhook_id(hint)
    assert webhook_id(hint).isascii() and " " not in webhook_id(hint)


def test_first_attempts_are_the_jobs_fan_out_would_make_one_by_one() -> None:
    recipients = [n.to_bytes(2, "big") * 16 for n in range(300)]
    payloads = first_attempts(recipients, b"\x07" * 33, 2**64 - 1, 1_700_000_000_000_000_000)
    jobs = [DeliveryJob.decode(p) for p in payloads]
    assert [j.recipient_id for j in jobs] == recipients
    assert {(j.topic, j.sequence_id, j.ingested_ns, j.attempt, j.all_gone) for j in jobs} == {
        (b"\x07" * 33, 2**64 - 1, 1_700_000_000_000_000_000, 1, True)
    }
    assert all(p == j.encode() for p, j in zip(payloads, jobs, strict=True))
    assert first_attempts([], b"\x07", 1, 2) == []
