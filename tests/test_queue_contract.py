"""The WorkQueue contract (app/queue/base.py), one suite for both implementations.

Every test runs against the in-process MemoryQueue and against RedisQueue on a
dedicated Redis database (one of REDIS_DATABASES, leased for the session so that
concurrent test runs never flush each other's data) that is emptied before each
test. Reclaim periods are kept short so the suite stays fast; timing assertions
have generous margins.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from app.queue.base import Commit, Delayed, Entry, WorkQueue
from app.queue.memory import MemoryQueue
from app.queue.redis_streams import RedisQueue

REDIS_SERVER = os.environ.get("XMTP_PUSH_TEST_REDIS_SERVER", "redis://127.0.0.1:6379")
# Databases this suite may take (9 belongs to the pipeline tests); 15 holds the leases, so that two
# test runs at once (several checkouts, a watcher) each flush only a database of their own.
REDIS_DATABASES = (8, 10, 11, 12, 13, 14)
LEASE_DATABASE = 15
LEASE_SECONDS = 900
RECLAIM = 0.3  # seconds; short, so the reclaim tests are fast
LONG_RECLAIM = 30.0  # for tests where nothing may ever go stale

MakeQueue = Callable[[float], Awaitable[WorkQueue]]


@dataclass(frozen=True)
class RedisDatabase:
    url: str
    lease_key: str
    lease: redis.Redis
    owner: str

    def flush(self) -> None:
        """Empty the database (and renew the lease). Synchronous: it also runs in fixture set-up."""
        holder = self.lease.get(self.lease_key)
        if holder not in (None, self.owner.encode()):
            raise RuntimeError(f"the lease on {self.url} expired and was taken by another test run")
        self.lease.set(self.lease_key, self.owner, ex=LEASE_SECONDS)
        with redis.Redis.from_url(self.url) as client:
            client.flushdb()


@pytest.fixture(scope="session")
def redis_database() -> Iterator[RedisDatabase]:
    """A dedicated Redis database, leased for this test session."""
    owner = f"{os.getpid()}-{secrets.token_hex(4)}"
    deadline = time.monotonic() + 60
    with redis.Redis.from_url(f"{REDIS_SERVER}/{LEASE_DATABASE}") as lease:
        while True:
            for number in REDIS_DATABASES:
                key = f"xmtp-push-test:queue-contract:db{number}"
                if lease.set(key, owner, nx=True, ex=LEASE_SECONDS):
                    database = RedisDatabase(f"{REDIS_SERVER}/{number}", key, lease, owner)
                    try:
                        yield database
                    finally:
                        if lease.get(key) == owner.encode():
                            database.flush()
                            lease.delete(key)
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no free Redis database among {REDIS_DATABASES} on {REDIS_SERVER}")
            time.sleep(0.5)


@pytest.fixture(params=["memory", "redis"])
async def make_queue(request: pytest.FixtureRequest) -> AsyncIterator[MakeQueue]:
    """A factory: `queue = await make_queue(reclaim_seconds)`; every queue made is closed after the test.
    The Redis database is emptied before each test."""
    made: list[WorkQueue] = []
    database: RedisDatabase | None = None
    if request.param == "redis":
        database = request.getfixturevalue("redis_database")
        database.flush()

    async def make(reclaim_seconds: float) -> WorkQueue:
        queue: WorkQueue
        if database is not None:
            queue = RedisQueue.from_url(database.url, reclaim_seconds=reclaim_seconds)
        else:
            queue = MemoryQueue(reclaim_seconds=reclaim_seconds)
        made.append(queue)
        return queue

    yield make
    for queue in made:
        await queue.close()


@pytest.fixture
async def queue(make_queue: MakeQueue) -> WorkQueue:
    return await make_queue(RECLAIM)


@pytest.fixture
async def steady_queue(make_queue: MakeQueue) -> WorkQueue:
    """A queue whose entries never go stale during a test."""
    return await make_queue(LONG_RECLAIM)


def payloads_of(entries: list[Entry]) -> list[bytes]:
    return [entry.payload for entry in entries]


async def read_all(queue: WorkQueue, stream: str, consumer: str = "c1", block: float = 0.05) -> list[Entry]:
    """Everything currently readable on the stream, however many reads it takes."""
    entries: list[Entry] = []
    while batch := await queue.read(stream, consumer, 100, block):
        entries.extend(batch)
    return entries


# ---- add / read ----------------------------------------------------------------------------------------


async def test_add_then_read_returns_payloads_in_order(steady_queue: WorkQueue) -> None:
    await steady_queue.add("s", [b"one", b"two"])
    await steady_queue.add("s", [b"three"])
    entries = await steady_queue.read("s", "c1", 10, 0.05)
    assert payloads_of(entries) == [b"one", b"two", b"three"]
    assert len({entry.id for entry in entries}) == 3


async def test_read_respects_count_and_continues_where_it_stopped(steady_queue: WorkQueue) -> None:
    await steady_queue.add("s", [b"%d" % i for i in range(5)])
    first = await steady_queue.read("s", "c1", 2, 0.05)
    second = await steady_queue.read("s", "c1", 10, 0.05)
    assert payloads_of(first) == [b"0", b"1"]
    assert payloads_of(second) == [b"2", b"3", b"4"]


async def test_payloads_are_binary_safe(steady_queue: WorkQueue) -> None:
    odd = [b"", b"\x00\xff\n\r", bytes(range(256)), "ünïcode".encode()]
    await steady_queue.add("s", odd)
    assert payloads_of(await steady_queue.read("s", "c1", 10, 0.05)) == odd


async def test_streams_are_independent(steady_queue: WorkQueue) -> None:
    await steady_queue.add("a", [b"for-a"])
    await steady_queue.add("b", [b"for-b"])
    assert payloads_of(await steady_queue.read("b", "c1", 10, 0.05)) == [b"for-b"]
    assert payloads_of(await steady_queue.read("a", "c1", 10, 0.05)) == [b"for-a"]


@pytest.fixture
async def redis_processes(redis_database: RedisDatabase) -> AsyncIterator[Callable[[], RedisQueue]]:
    """Redis only: several RedisQueue instances, as separate worker processes would hold them."""
    redis_database.flush()
    made: list[RedisQueue] = []

    def make() -> RedisQueue:
        made.append(RedisQueue.from_url(redis_database.url, reclaim_seconds=RECLAIM))
        return made[-1]

    yield make
    for queue in made:
        await queue.close()


async def test_redis_processes_share_streams_and_reclaim(redis_processes: Callable[[], RedisQueue]) -> None:
    """Entries added before any reader existed reach a reader in another process, and an entry left
    pending by one process is reclaimed by another (MemoryQueue lives inside one process)."""
    writer, crashed, survivor = redis_processes(), redis_processes(), redis_processes()
    await writer.add("s", [b"early"])
    taken = await crashed.read("s", "worker-1", 10, 0.05)
    assert payloads_of(taken) == [b"early"]
    assert await survivor.read("s", "worker-2", 10, 0.02) == []
    await asyncio.sleep(RECLAIM + 0.1)
    assert payloads_of(await survivor.read("s", "worker-2", 10, 0.05)) == [b"early"]
    await survivor.commit("s", Commit(ack=[taken[0].id]))
    assert await writer.depth("s") == 0


async def test_redis_recovers_when_the_stream_vanishes(
    redis_processes: Callable[[], RedisQueue], redis_database: RedisDatabase
) -> None:
    """Redis restarted without its data (or the key was deleted): reads must not fail forever."""
    queue = redis_processes()
    assert await queue.read("s", "c1", 10, 0.02) == []  # the consumer group now exists and is remembered
    redis_database.flush()
    await queue.add("s", [b"after the loss"])
    entries: list[Entry] = []
    for _ in range(3):
        entries = await queue.read("s", "c1", 10, 0.05)
        if entries:
            break
    assert payloads_of(entries) == [b"after the loss"]

    blocked = asyncio.create_task(queue.read("s", "c1", 10, 2.0))
    await asyncio.sleep(0.1)
    redis_database.flush()  # deletes the stream under a blocked read
    assert await asyncio.wait_for(blocked, 3.0) == []
    await queue.add("s", [b"again"])
    assert payloads_of(await read_all(queue, "s")) == [b"again"]


async def test_read_on_empty_stream_blocks_up_to_block_seconds(steady_queue: WorkQueue) -> None:
    started = time.monotonic()
    assert await steady_queue.read("s", "c1", 10, 0.3) == []
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.0


async def test_read_with_entries_waiting_does_not_block(steady_queue: WorkQueue) -> None:
    await steady_queue.add("s", [b"ready"])
    started = time.monotonic()
    assert payloads_of(await steady_queue.read("s", "c1", 10, 5.0)) == [b"ready"]
    assert time.monotonic() - started < 0.5


async def test_blocked_read_wakes_up_when_an_entry_arrives(steady_queue: WorkQueue) -> None:
    reader = asyncio.create_task(steady_queue.read("s", "c1", 10, 5.0))
    await asyncio.sleep(0.1)
    assert not reader.done()
    started = time.monotonic()
    await steady_queue.add("s", [b"wake"])
    entries = await asyncio.wait_for(reader, 2.0)
    assert payloads_of(entries) == [b"wake"]
    assert time.monotonic() - started < 1.0


async def test_add_of_many_payloads_is_all_or_nothing_for_readers(steady_queue: WorkQueue) -> None:
    total = 1000
    payloads = [b"p%04d" % i for i in range(total)]
    seen_depths: list[int] = []
    first_batch: list[Entry] = []
    stop = asyncio.Event()

    async def reader() -> None:
        while not first_batch:
            first_batch.extend(await steady_queue.read("s", "reader", 5000, 0.01))

    async def observer() -> None:
        while not stop.is_set():
            seen_depths.append(await steady_queue.depth("s"))
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(reader()), asyncio.create_task(observer())]
    await asyncio.sleep(0.05)
    await steady_queue.add("s", payloads)
    await asyncio.wait_for(tasks[0], 5.0)
    stop.set()
    await tasks[1]
    assert payloads_of(first_batch) == payloads
    assert set(seen_depths) <= {0, total}


async def test_add_of_nothing_is_harmless(steady_queue: WorkQueue) -> None:
    await steady_queue.add("s", [])
    assert await steady_queue.depth("s") == 0
    assert await steady_queue.read("s", "c1", 10, 0.05) == []


# ---- reclaim -------------------------------------------------------------------------------------------


async def test_unacknowledged_entries_go_to_another_consumer_after_reclaim(queue: WorkQueue) -> None:
    await queue.add("s", [b"a", b"b", b"c"])
    taken = await queue.read("s", "crashed", 10, 0.05)
    assert payloads_of(taken) == [b"a", b"b", b"c"]
    started = time.monotonic()

    # Not before the reclaim period.
    assert await queue.read("s", "other", 10, 0.02) == []
    await asyncio.sleep(RECLAIM / 2 - (time.monotonic() - started))
    assert await queue.read("s", "other", 10, 0.02) == []
    assert time.monotonic() - started < RECLAIM

    # After it: the same entries, same ids.
    await asyncio.sleep(RECLAIM + 0.1 - (time.monotonic() - started))
    reclaimed = await queue.read("s", "other", 10, 0.05)
    assert [(e.id, e.payload) for e in reclaimed] == [(e.id, e.payload) for e in taken]

    # Now held afresh by "other": nobody else gets them right away.
    assert await queue.read("s", "crashed", 10, 0.02) == []
    await queue.commit("s", Commit(ack=[e.id for e in reclaimed]))
    assert await queue.depth("s") == 0


async def test_reclaimed_entries_come_before_new_ones_and_respect_count(queue: WorkQueue) -> None:
    await queue.add("s", [b"old1", b"old2"])
    await queue.read("s", "crashed", 10, 0.05)
    await queue.add("s", [b"new1", b"new2"])
    await asyncio.sleep(RECLAIM + 0.1)
    first = await queue.read("s", "other", 3, 0.05)
    assert payloads_of(first) == [b"old1", b"old2", b"new1"]
    assert payloads_of(await queue.read("s", "other", 10, 0.05)) == [b"new2"]


async def test_acknowledged_entries_are_never_handed_out_again(queue: WorkQueue) -> None:
    await queue.add("s", [b"done", b"dropped"])
    entries = await queue.read("s", "c1", 10, 0.05)
    await queue.commit("s", Commit(ack=[entries[0].id]))
    await asyncio.sleep(RECLAIM + 0.1)
    assert payloads_of(await read_all(queue, "s", "c2")) == [b"dropped"]


async def test_concurrent_readers_never_share_an_entry_that_is_not_stale(steady_queue: WorkQueue) -> None:
    total = 300
    await steady_queue.add("s", [b"%03d" % i for i in range(total)])
    received: dict[str, list[Entry]] = {}

    async def consume(name: str) -> None:
        mine = received.setdefault(name, [])
        while batch := await steady_queue.read("s", name, 7, 0.05):
            mine.extend(batch)
            await asyncio.sleep(0)

    await asyncio.wait_for(asyncio.gather(*(consume(f"c{i}") for i in range(4))), 10.0)
    everything = [entry for entries in received.values() for entry in entries]
    assert len(everything) == total
    assert len({entry.id for entry in everything}) == total
    assert sorted(payloads_of(everything)) == [b"%03d" % i for i in range(total)]
    assert sum(1 for entries in received.values() if entries) >= 2  # the readers really interleaved


# ---- commit --------------------------------------------------------------------------------------------


async def test_commit_acks_adds_and_delays_together(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.add("in", [b"x", b"y", b"z"])
    entries = await q.read("in", "c1", 10, 0.05)
    assert await q.depth("in") == 3
    due = time.time() + 3600
    commit = Commit(ack=[entries[0].id, entries[1].id])
    commit.add_to("out", b"o1")
    commit.add_to("out", b"o2")
    commit.add_to("other", b"t1")
    commit.delay.append(Delayed("retry", b"later", due))
    await q.commit("in", commit)

    assert await q.depth("in") == 1  # z is still in flight
    assert await q.depth("out") == 2
    assert await q.depth("other") == 1
    assert await q.delayed_count() == 1
    assert await q.depth("retry") == 0  # not before it is due
    assert payloads_of(await q.read("out", "c1", 10, 0.05)) == [b"o1", b"o2"]
    assert payloads_of(await q.read("other", "c1", 10, 0.05)) == [b"t1"]

    assert await q.promote_due(due, 10) == 1
    assert payloads_of(await q.read("retry", "c1", 10, 0.05)) == [b"later"]


async def test_commit_of_only_additions_or_only_delays(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.commit("in", Commit(add={"out": [b"a"]}))
    await q.commit("in", Commit(delay=[Delayed("out", b"b", time.time() + 60)]))
    await q.commit("in", Commit())
    assert await q.depth("out") == 1
    assert await q.delayed_count() == 1


async def test_commit_ack_of_an_already_acked_entry_is_harmless(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.add("in", [b"a", b"b"])
    entries = await q.read("in", "c1", 10, 0.05)
    await q.commit("in", Commit(ack=[entries[0].id]))
    await q.commit("in", Commit(ack=[entries[0].id]))
    assert await q.depth("in") == 1


async def test_commit_may_add_to_the_stream_it_acknowledges(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.add("in", [b"first"])
    entries = await q.read("in", "c1", 10, 0.05)
    await q.commit("in", Commit(ack=[entries[0].id], add={"in": [b"next page"]}))
    assert await q.depth("in") == 1
    assert payloads_of(await q.read("in", "c1", 10, 0.05)) == [b"next page"]


# ---- delayed entries -----------------------------------------------------------------------------------


async def test_promote_due_moves_only_due_entries_and_respects_the_limit(steady_queue: WorkQueue) -> None:
    q = steady_queue
    now = time.time()
    await q.commit(
        "in",
        Commit(
            delay=[
                Delayed("s1", b"p2", now - 5),
                Delayed("s1", b"p1", now - 10),
                Delayed("s2", b"p3", now - 1),
                Delayed("s1", b"future", now + 60),
            ]
        ),
    )
    assert await q.delayed_count() == 4
    assert await q.promote_due(now, 2) == 2
    assert await q.delayed_count() == 2
    assert await q.promote_due(now, 10) == 1
    assert await q.promote_due(now, 10) == 0
    assert await q.delayed_count() == 1
    assert payloads_of(await q.read("s1", "c1", 10, 0.05)) == [b"p1", b"p2"]  # earliest due first
    assert payloads_of(await q.read("s2", "c1", 10, 0.05)) == [b"p3"]

    assert await q.promote_due(now + 61, 10) == 1
    assert await q.delayed_count() == 0
    assert payloads_of(await q.read("s1", "c1", 10, 0.05)) == [b"future"]


async def test_a_newer_keyed_delay_replaces_the_one_waiting_and_an_older_one_is_dropped(
    steady_queue: WorkQueue,
) -> None:
    q, now = steady_queue, time.time()
    await q.commit("in", Commit(delay=[Delayed("s", b"seq 5", now - 3, "k1", 5)]))
    await q.commit("in", Commit(delay=[Delayed("s", b"seq 7", now - 2, "k1", 7)]))  # replaces seq 5
    await q.commit("in", Commit(delay=[Delayed("s", b"seq 6", now - 1, "k1", 6)]))  # older: dropped
    await q.commit(
        "in", Commit(delay=[Delayed("s", b"other key", now - 1, "k2", 1), Delayed("s", b"no key", now - 1)])
    )
    assert await q.delayed_count() == 3
    assert await q.promote_due(now, 10) == 3
    assert sorted(payloads_of(await q.read("s", "c1", 10, 0.05))) == [b"no key", b"other key", b"seq 7"]
    assert await q.delayed_count() == 0


async def test_a_keyed_delay_survives_while_its_replacement_is_later(steady_queue: WorkQueue) -> None:
    """Replacing keeps the newer entry's due time: an outage ends with the newest hint, when it is due."""
    q, now = steady_queue, time.time()
    await q.commit("in", Commit(delay=[Delayed("s", b"seq 1", now - 1, "k", 1)]))
    await q.commit("in", Commit(delay=[Delayed("s", b"seq 2", now + 60, "k", 2)]))
    assert await q.promote_due(now, 10) == 0
    assert await q.promote_due(now + 61, 10) == 1
    assert payloads_of(await q.read("s", "c1", 10, 0.05)) == [b"seq 2"]


async def test_promote_due_keeps_binary_payloads_and_stream_names_intact(steady_queue: WorkQueue) -> None:
    q = steady_queue
    payload = b"line1\nline2\x00\xff"
    await q.commit("in", Commit(delay=[Delayed("deliveries.http", payload, time.time() - 1)]))
    assert await q.promote_due(time.time(), 10) == 1
    assert payloads_of(await q.read("deliveries.http", "c1", 10, 0.05)) == [payload]


async def test_promote_due_wakes_a_blocked_reader(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.commit("in", Commit(delay=[Delayed("s", b"due", time.time() - 1)]))
    reader = asyncio.create_task(q.read("s", "c1", 10, 5.0))
    await asyncio.sleep(0.1)
    assert await q.promote_due(time.time(), 10) == 1
    assert payloads_of(await asyncio.wait_for(reader, 2.0)) == [b"due"]


# ---- claim_once ----------------------------------------------------------------------------------------


async def test_claim_once_free_same_owner_other_owner(steady_queue: WorkQueue) -> None:
    q = steady_queue
    assert await q.claim_once([], 60) == []
    assert await q.claim_once([("k1", "a")], 60) == [True]
    assert await q.claim_once([("k1", "a")], 60) == [True]
    assert await q.claim_once([("k1", "b")], 60) == [False]
    # Per pair, in order: k2 is free for a, then held by a when b asks.
    assert await q.claim_once([("k2", "a"), ("k1", "b"), ("k2", "b"), ("k1", "a")], 60) == [
        True,
        False,
        False,
        True,
    ]


async def test_claim_expires_after_its_ttl(steady_queue: WorkQueue) -> None:
    q = steady_queue
    assert await q.claim_once([("k", "a")], 1) == [True]
    assert await q.claim_once([("k", "b")], 1) == [False]
    await asyncio.sleep(1.15)
    assert await q.claim_once([("k", "b")], 1) == [True]
    assert await q.claim_once([("k", "a")], 1) == [False]


# ---- depth and the rest --------------------------------------------------------------------------------


async def test_depth_counts_waiting_and_in_flight(steady_queue: WorkQueue) -> None:
    q = steady_queue
    assert await q.depth("s") == 0
    await q.add("s", [b"1", b"2", b"3", b"4", b"5"])
    assert await q.depth("s") == 5
    in_flight = await q.read("s", "c1", 2, 0.05)
    assert await q.depth("s") == 5
    await q.commit("s", Commit(ack=[in_flight[0].id]))
    assert await q.depth("s") == 4
    await q.commit("s", Commit(ack=[e.id for e in await read_all(q, "s")] + [in_flight[1].id]))
    assert await q.depth("s") == 0


async def test_ping(steady_queue: WorkQueue) -> None:
    assert await steady_queue.ping() is True


# ---- consumers -----------------------------------------------------------------------------------------


async def test_retiring_consumers_removes_only_those_holding_nothing(steady_queue: WorkQueue) -> None:
    q = steady_queue
    await q.add("s", [b"one", b"two"])
    [held] = await q.read("s", "worker-a", 1, 0.05)
    [done] = await q.read("s", "worker-b", 1, 0.05)
    await q.commit("s", Commit(ack=[done.id]))
    named = isinstance(q, RedisQueue)  # the in-process queue names no consumers
    # worker-a still holds an entry: it stays, even when named; worker-b holds nothing: it goes.
    assert await q.retire_consumers("s", 3600, ["worker-a", "worker-b"]) == (1 if named else 0)
    assert await q.retire_consumers("s", 3600, ["worker-a"]) == 0
    await q.commit("s", Commit(ack=[held.id]))
    # Not named, but idle longer than allowed (here: any idle time at all) and holding nothing.
    await asyncio.sleep(0.01)
    assert await q.retire_consumers("s", 0.0) == (1 if named else 0)
    assert await q.retire_consumers("no-such-stream", 0.0) == 0
