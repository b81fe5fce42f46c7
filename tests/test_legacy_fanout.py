"""A legacy fan-out job reads several pages of its topic before it hands the rest on, and a topic
whose first page is full is handed on as installation-id ranges, each subscriber in one
(docs/legacy.md#from-envelope-to-push)."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections import Counter
from datetime import UTC, datetime

from app.core.channels import Channel
from app.delivery.providers.apns import MAX_BODY_BYTES
from app.legacy.fanout import PAGES_PER_JOB, LegacyFanout, channel_chooser
from app.legacy.jobs import (
    LegacyDeliveryJob,
    LegacyEnvelope,
    LegacyFanoutJob,
    encode_delivery,
    legacy_delivery_stream,
    shared_fields,
)
from app.legacy.models import LegacyHmacKey, LegacyInstallation, LegacySubscription
from app.legacy.payloads import LegacyDelivery, PayloadSettings, apns_push
from app.runtime import Runtime, open_runtime
from tests.support import legacy_vector as vector
from tests.support import make_settings
from tests.support.legacy import group, welcome

PAGE = 3
CHANNELS = channel_chooser(apns=True, fcm=True, http=False)


async def test_a_job_reads_pages_up_to_its_bound_then_hands_the_rest_on(database_url: str) -> None:
    topic = welcome(time.time_ns())  # a topic of this run alone (the database is shared)
    subscribers = PAGE * PAGES_PER_JOB + 2
    ids = [f"installation-{n:03}" for n in range(subscribers)]
    async with open_runtime(make_settings(database_url)) as runtime:
        now = time.time_ns()
        async with runtime.sessions() as session, session.begin():
            session.add_all(LegacyInstallation(id=i, kind=1, token=f"t{i}", registered_ns=now) for i in ids)
            session.add_all(LegacySubscription(topic=topic, installation_id=i, created_ns=now) for i in ids)
        fanout = LegacyFanout(runtime.legacy_rules, PAGE, CHANNELS)
        job = LegacyFanoutJob(LegacyEnvelope(topic, now, b"\x0a\x00", "key"), now)
        pushed = []
        async with runtime.reads() as session:
            first = await fanout.fan_out(session, job)
            assert [j.after for j in first.next_jobs] == [ids[PAGE * PAGES_PER_JOB - 1]]
            rest = await fanout.fan_out(session, first.next_jobs[0])
            assert rest.next_jobs == []
        for page in (first, rest):
            assert set(page.deliveries) == {legacy_delivery_stream(Channel.APNS)}
            payloads = page.deliveries[legacy_delivery_stream(Channel.APNS)]
            pushed.append([LegacyDeliveryJob.decode(p).installation_id for p in payloads])
    assert pushed == [ids[: PAGE * PAGES_PER_JOB], ids[PAGE * PAGES_PER_JOB :]]


# Ids as the apps choose them: one character to hundreds, letters in either case, punctuation, digits,
# accents and other scripts; the database orders and compares them, in its collation.
UNEVEN = [
    "a",
    "B",
    "b",
    "-",
    "0",
    "9z",
    "a-1",
    "a1",
    "A_1",
    "ab",
    "é",
    "e",
    "ß",
    "ss",
    "日本",
    "日",
    "Ω",
    "ω",
    "x" * 300,
    "y" * 64,
    "a b",
    "a.b",
    "🙂",
    "installation-7",
    "Installation-7",
    "z",
    "ZZ",
    "zz",
]


def ids_of(tag: str, bases: list[str]) -> list[str]:
    """Ids of one test alone (the database is shared by the session's tests)."""
    return [f"{base}{tag}" for base in bases]


async def store(runtime: Runtime, topic: str, pushable: list[str], not_pushable: list[str]) -> int:
    """Subscribers of `topic`: those given as pushable, and as many as each way of not being one
    (an inactive subscription, a deleted installation, one without a token)."""
    now = time.time_ns()
    off, deleted, tokenless = (not_pushable[k::3] for k in range(3))
    async with runtime.sessions() as session, session.begin():
        for i in [*pushable, *off, *deleted, *tokenless]:
            token = None if i in tokenless else f"t{i}"
            session.add(
                LegacyInstallation(id=i, kind=1, token=token, registered_ns=now, deleted=i in deleted)
            )
            session.add(
                LegacySubscription(topic=topic, installation_id=i, created_ns=now, active=i not in off)
            )
    return now


async def fan_out_all(
    fanout: LegacyFanout, runtime: Runtime, job: LegacyFanoutJob
) -> tuple[list[str], list[LegacyFanoutJob]]:
    """Every job of an envelope run to the end, as the consumers would: (the installations pushed,
    in the order pushed, the jobs run)."""
    pushed, done, queued = [], [], [job]
    async with runtime.reads() as session:
        while queued:
            job = queued.pop(0)
            page = await fanout.fan_out(session, job)
            for payloads in page.deliveries.values():
                pushed += [LegacyDeliveryJob.decode(p).installation_id for p in payloads]
            done.append(job)
            queued += page.next_jobs
    return pushed, done


async def test_a_full_first_page_hands_the_rest_on_as_ranges_covering_each_subscriber_once(
    database_url: str,
) -> None:
    topic, ranges = welcome(time.time_ns()), 4
    pushable = ids_of("①", UNEVEN)
    not_pushable = ids_of("①", [f"{base}~gone" for base in UNEVEN[:9]])
    async with open_runtime(make_settings(database_url)) as runtime:
        now = await store(runtime, topic, pushable, not_pushable)
        fanout = LegacyFanout(runtime.legacy_rules, PAGE, CHANNELS, ranges)
        job = LegacyFanoutJob(LegacyEnvelope(topic, now, b"\x0a\x00", "key"), now)
        pushed, jobs = await fan_out_all(fanout, runtime, job)
    assert sorted(pushed) == sorted(pushable)  # each pushable subscriber, none twice, nobody else
    first_split = jobs[1 : ranges + 1]
    assert [bool(j.until) for j in first_split] == [True] * (ranges - 1) + [False]  # the last: to the end
    assert all(a.until == b.after for a, b in itertools.pairwise(first_split))  # adjacent, no gap


async def test_ranges_beyond_the_subscribers_left_are_one_a_subscriber(database_url: str) -> None:
    topic = welcome(time.time_ns())
    pushable = ids_of("②", ["ä", "a", "b" * 100, "日本語", "-"])
    async with open_runtime(make_settings(database_url)) as runtime:
        now = await store(runtime, topic, pushable, [])
        fanout = LegacyFanout(runtime.legacy_rules, PAGE, CHANNELS, 16)
        job = LegacyFanoutJob(LegacyEnvelope(topic, now, b"\x0a\x00", "key"), now)
        pushed, jobs = await fan_out_all(fanout, runtime, job)
    assert sorted(pushed) == sorted(pushable)
    assert len(jobs) == 1 + 2  # two subscribers left after the first page of three: two ranges of one


async def test_a_range_is_read_ten_pages_a_job(database_url: str) -> None:
    topic = welcome(time.time_ns())
    per_range = PAGE * PAGES_PER_JOB + 1  # one more than a job reads: two jobs a range
    pushable = ids_of("③", [f"{n:x}" for n in range(PAGE + 2 * per_range)])
    async with open_runtime(make_settings(database_url)) as runtime:
        now = await store(runtime, topic, pushable, [])
        fanout = LegacyFanout(runtime.legacy_rules, PAGE, CHANNELS, 2)
        job = LegacyFanoutJob(LegacyEnvelope(topic, now, b"\x0a\x00", "key"), now)
        pushed, jobs = await fan_out_all(fanout, runtime, job)
    assert sorted(pushed) == sorted(pushable) and len(pushed) == len(set(pushed))
    assert len(jobs) == 1 + 2 * 2


def test_a_job_queued_before_ranges_covers_the_rest_of_its_topic() -> None:
    envelope = LegacyEnvelope("/xmtp/mls/1/w-x/proto", 5, b"\x0a\x00", "key")
    old = json.dumps(["/xmtp/mls/1/w-x/proto", 5, "CgA=", "key", 7, "a1"]).encode()
    assert LegacyFanoutJob.decode(old) == LegacyFanoutJob(envelope, 7, "a1", "")
    ranged = LegacyFanoutJob(envelope, 7, "a1", "日本")
    assert LegacyFanoutJob.decode(ranged.encode()) == ranged


def test_a_delivery_job_written_from_the_shared_part_is_the_job_itself() -> None:
    """The fan-out writes each job from the part its envelope's jobs share: the same bytes as the job's
    own encoding, for ids and topics that need escaping too, and it decodes to the same job."""
    for installation_id, topic in (("plain", "/xmtp/mls/1/g-00/proto"), ('quo"te\\é😀', "t\x01\u2028")):
        job = LegacyDeliveryJob(installation_id, topic, b"\x00\xffmsg", 2**63 + 5, "k:1", True, 17, 18)
        shared = shared_fields(job.topic, job.message, job.timestamp_ns, job.idempotency_key)
        encoded = encode_delivery(installation_id, shared, True, 17, 18)
        assert encoded == job.encode()
        fields = [installation_id, topic, "AP9tc2c=", 2**63 + 5, "k:1", True, 17, 18, 1, True]
        assert json.loads(encoded) == fields
        assert LegacyDeliveryJob.decode(encoded) == job


def test_a_delivery_job_reads_the_same_by_its_pattern_as_by_json() -> None:
    """A job with nothing escaped is read by a pattern: each field as json.loads reads it (the same
    job with spaces added, which only json.loads takes)."""
    jobs = [
        LegacyDeliveryJob("i-1", "/xmtp/mls/1/g-00/proto", b"", 0, "k", False, 0, 0),
        LegacyDeliveryJob(
            "", "/xmtp/mls/1/w-ff/proto", bytes(range(256)), 2**64 - 1, "a" * 40, True, -1, 9, 4, False
        ),
    ]
    for job in jobs:
        spaced = job.encode().replace(b",", b", ")
        assert LegacyDeliveryJob.decode(job.encode()) == LegacyDeliveryJob.decode(spaced) == job


async def test_a_subscriber_holding_the_senders_key_for_the_period_is_not_pushed(database_url: str) -> None:
    """The test vector's message at its time: the subscription with key(671) is suppressed; one with
    another period's key, another key for 671, or none, is pushed."""
    # A group topic of this run's own: the verdict reads the message, not which group's topic it came by.
    run = f"{time.time_ns()}"
    topic = group(time.time_ns())
    rows = {f"{run}-sender": {671: vector.key(671)}, f"{run}-old": {670: vector.key(670)}}
    rows |= {f"{run}-other": {671: b"k" * 42}, f"{run}-none": {}}
    async with open_runtime(make_settings(database_url)) as runtime:
        async with runtime.sessions() as session, session.begin():
            now = time.time_ns()
            session.add_all(LegacyInstallation(id=i, kind=1, token=f"t{i}", registered_ns=now) for i in rows)
            session.add_all(LegacySubscription(topic=topic, installation_id=i, created_ns=now) for i in rows)
            session.add_all(
                LegacyHmacKey(installation_id=i, topic=topic, period=p, key=k)
                for i, keys in rows.items()
                for p, k in keys.items()
            )
        message = base64.b64decode(vector.MESSAGE_B64)
        envelope = LegacyEnvelope(topic, vector.TIMESTAMP_NS, message, run)
        fanout = LegacyFanout(runtime.legacy_rules, 1000, CHANNELS)
        async with runtime.reads() as session:
            page = await fanout.fan_out(session, LegacyFanoutJob(envelope, now, run))
    pushed = [
        LegacyDeliveryJob.decode(p).installation_id
        for p in page.deliveries[legacy_delivery_stream(Channel.APNS)]
    ]
    assert sorted(i for i in pushed if i.startswith(run)) == sorted(
        [f"{run}-old", f"{run}-other", f"{run}-none"]
    )
    assert page.skipped == Counter({(Channel.APNS, "suppressed"): 1})


def body_size(topic: str, message: bytes, is_silent: bool) -> int:
    probe = LegacyDelivery(topic, message, 0, "k", "i", "apns", "t", is_silent, datetime.now(UTC), None)
    return len(apns_push(probe, PayloadSettings()).payload)  # type: ignore[arg-type]


async def test_a_message_too_large_for_apns_is_rejected_at_fan_out_not_queued_per_subscriber(
    database_url: str,
) -> None:
    topic = welcome(time.time_ns())
    # A message whose silent body fits APNs's 4,096 bytes and whose alert body does not.
    size = next(n for n in range(2800, 3200) if body_size(topic, b"m" * n, False) > MAX_BODY_BYTES)
    message = b"m" * size
    assert body_size(topic, message, True) <= MAX_BODY_BYTES
    # Three installations alerted and one silent on APNs, two on FCM (which sets no limit of ours).
    rows = [
        ("a-1", 1, False),
        ("a-2", 1, False),
        ("a-3", 1, False),
        ("a-4", 1, True),
        ("f-1", 2, False),
        ("f-2", 2, True),
    ]
    async with open_runtime(make_settings(database_url)) as runtime:
        now = time.time_ns()
        async with runtime.sessions() as session, session.begin():
            session.add_all(
                LegacyInstallation(id=i, kind=k, token=f"t{i}", registered_ns=now) for i, k, _ in rows
            )
            session.add_all(
                LegacySubscription(topic=topic, installation_id=i, created_ns=now, is_silent=s)
                for i, _, s in rows
            )
        fanout = LegacyFanout(runtime.legacy_rules, 100, CHANNELS)
        async with runtime.reads() as session:
            page = await fanout.fan_out(
                session, LegacyFanoutJob(LegacyEnvelope(topic, now, message, "key"), now)
            )
    queued = {
        stream: [LegacyDeliveryJob.decode(p).installation_id for p in payloads]
        for stream, payloads in page.deliveries.items()
    }
    assert queued == {
        legacy_delivery_stream(Channel.APNS): ["a-4"],
        legacy_delivery_stream(Channel.FCM): ["f-1", "f-2"],
    }
    assert page.skipped == Counter({(Channel.APNS, "rejected"): 3})
