"""The WorkQueue contract (app/queue/base.py), one suite for both implementations.

Every test runs against the in-process MemoryQueue, against RedisQueue on a
dedicated Redis database (one of REDIS_DATABASES, leased for the session so that
concurrent test runs never flush each other's data) and against RedisQueue on
the test Redis Cluster (tests/support/redis_cluster.py), emptied before each
test. Reclaim periods are kept short so the suite stays fast; timing assertions
have generous margins.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import pytest
import redis

from app.queue.base import Commit, Delayed, Entry, PartitionCountMismatch, WorkQueue
from app.queue.doorbell import CHANNEL as DOORBELL
from app.queue.memory import MemoryQueue
from app.queue.redis_calls import stream_key
from app.queue.redis_streams import RedisQueue
from tests.support.redis_cluster import ClusterUnderTest, killable_primary

REDIS_SERVER = os.environ.get("XMTP_PUSH_TEST_REDIS_SERVER", "redis://127.0.0.1:6379")
# Databases this suite may take (9 belongs to the pipeline tests); 15 holds the leases, so that two
# test runs at once (several checkouts, a watcher) each flush only a database of their own.
REDIS_DATABASES = (8, 10, 11, 12, 13, 14)
LEASE_DATABASE = 15
LEASE_SECONDS = 900
RECLAIM = 0.3  # seconds; short, so the reclaim tests are fast
LONG_RECLAIM = 30.0  # for tests where nothing may ever go stale

PARTITIONS = 64  # the default count
MakeQueue = Callable[..., Awaitable[WorkQueue]]


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


class Flushable(Protocol):
    url: str

    def flush(self) -> None: ...


def redis_of(request: pytest.FixtureRequest, kind: str) -> Flushable:
    """The single Redis's test database or the test cluster, emptied."""
    server: Flushable = request.getfixturevalue("redis_database" if kind == "redis" else "redis_cluster")
    server.flush()
    return server


@pytest.fixture(params=["memory", "redis", "cluster"])
async def make_queue(request: pytest.FixtureRequest) -> AsyncIterator[MakeQueue]:
    """A factory: `queue = await make_queue(reclaim_seconds)`; every queue made is closed after the test.
    Redis (the database, or the cluster) is emptied before each test."""
    made: list[WorkQueue] = []
    database = None if request.param == "memory" else redis_of(request, request.param)

    async def make(reclaim_seconds: float, partitions: int = PARTITIONS) -> WorkQueue:
        queue: WorkQueue
        if database is not None:
            queue = RedisQueue.from_url(database.url, reclaim_seconds=reclaim_seconds, partitions=partitions)
        else:
            queue = MemoryQueue(reclaim_seconds=reclaim_seconds, partitions=partitions)
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


async def warmed(queue: WorkQueue, stream: str) -> None:
    """Read the empty stream once, so that a timed read is not a first one: a first read connects and
    makes the stream's group on every partition (64 on a cluster: tens of milliseconds, more on a
    loaded machine)."""
    assert await queue.read(stream, "warm-up", 10, 0.01) == []


async def first_found(
    queue: WorkQueue, stream: str, consumer: str, seconds: float
) -> tuple[list[Entry], float]:
    """Read until something comes: what came, and when the read that brought it returned."""
    deadline = time.monotonic() + seconds
    while not (entries := await queue.read(stream, consumer, 10, 0.02)):
        assert time.monotonic() < deadline, f"nothing came on {stream} within {seconds} s"
    return entries, time.monotonic()


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


@pytest.fixture(params=["redis", "cluster"])
def redis_server(request: pytest.FixtureRequest) -> Flushable:
    """The single Redis's test database, then the test cluster, emptied."""
    return redis_of(request, request.param)


@pytest.fixture
async def redis_processes(redis_server: Flushable) -> AsyncIterator[Callable[[], RedisQueue]]:
    """Redis only: several RedisQueue instances, as separate worker processes would hold them."""
    made: list[RedisQueue] = []

    def make() -> RedisQueue:
        made.append(RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM))
        return made[-1]

    yield make
    for queue in made:
        await queue.close()


async def woken_within(adder: WorkQueue, reader_side: WorkQueue, rounds: int) -> list[float]:
    """How long a reader resting on an empty stream took to return what `adder` added, per round."""
    await adder.add("warm-adder", [b"connects"])
    waits = []
    for round_number in range(rounds):
        stream = f"s{round_number}"  # its own stream: nothing left pending is reclaimed into this read
        reader = asyncio.create_task(reader_side.read(stream, "c1", 10, 5.0))
        await asyncio.sleep(0.6 + 0.03 * round_number)  # long enough for the rests to reach their longest
        started = time.monotonic()
        await adder.add(stream, [b"envelope"])
        assert payloads_of(await asyncio.wait_for(reader, 2.0)) == [b"envelope"]
        waits.append(time.monotonic() - started)
    return sorted(waits)


async def test_work_one_process_adds_wakes_the_resting_readers_of_another(
    redis_processes: Callable[[], RedisQueue],
) -> None:
    # The API process ingesting an envelope, a worker's reader resting on the empty stream: woken by
    # the doorbell, not after its rest (up to 0.2 s).
    waits = await woken_within(redis_processes(), redis_processes(), 5)
    assert waits[2] < 0.05, waits


async def test_a_lost_doorbell_subscription_is_made_again(
    redis_processes: Callable[[], RedisQueue], redis_server: Flushable
) -> None:
    adder, reader_side = redis_processes(), redis_processes()
    assert await reader_side.read("warm", "c1", 10, 0.01) == []  # its first read subscribes
    await subscribed(redis_server.url, "its first read")
    assert kill_subscriptions(redis_server.url) >= 1
    await subscribed(redis_server.url, "the subscription made again after its first backoff (0.1 s)")
    waits = await woken_within(adder, reader_side, 5)
    assert waits[2] < 0.05, waits


def on_every_node(url: str, *command: str) -> list[object]:
    """A command's answer from the server, or from each node of a cluster."""
    with redis.Redis.from_url(url) as probe:
        if int(probe.info("cluster").get("cluster_enabled", 0)) != 1:
            return [probe.execute_command(*command)]
    with redis.RedisCluster.from_url(url) as nodes:
        return list(nodes.execute_command(*command, target_nodes=redis.RedisCluster.ALL_NODES).values())


async def subscribed(url: str, what: str, seconds: float = 5.0) -> None:
    """Wait until a doorbell subscription is open on the server (on any node of a cluster)."""
    deadline = time.monotonic() + seconds
    while sum(int(dict(pairs)[DOORBELL.encode()]) for pairs in _numsub(url)) < 1:
        assert time.monotonic() < deadline, f"no doorbell subscription after {seconds} s: {what}"
        await asyncio.sleep(0.02)


def _numsub(url: str) -> list[list[tuple[bytes, int]]]:
    replies = on_every_node(url, "PUBSUB", "NUMSUB", DOORBELL)
    return [list(zip(reply[::2], reply[1::2], strict=True)) for reply in replies]


def kill_subscriptions(url: str) -> int:
    """Close every pub/sub connection of the server (of each node of a cluster); how many were."""
    return sum(int(n) for n in on_every_node(url, "CLIENT", "KILL", "TYPE", "pubsub"))


async def test_redis_processes_share_streams_and_reclaim(redis_processes: Callable[[], RedisQueue]) -> None:
    """Entries added before any reader existed reach a reader in another process, and an entry left
    pending by one process is reclaimed by another (MemoryQueue lives inside one process)."""
    writer, crashed, survivor = redis_processes(), redis_processes(), redis_processes()
    # The survivor connects and joins the group first: a process's first read connects, checks the
    # partition count and makes the group on every partition (64 on a cluster), which on a loaded
    # machine can outlast the reclaim period and would then rightly reclaim the entry below.
    assert await survivor.read("s", "worker-2", 10, 0.02) == []
    await writer.add("s", [b"early"])
    taken = await crashed.read("s", "worker-1", 10, 0.05)
    assert payloads_of(taken) == [b"early"]
    read_at = time.monotonic()
    again = await survivor.read("s", "worker-2", 10, 0.02)
    assert again == [], f"handed out again {time.monotonic() - read_at:.2f} s after it was read"
    await asyncio.sleep(RECLAIM + 0.1)
    assert payloads_of(await survivor.read("s", "worker-2", 10, 0.05)) == [b"early"]
    await survivor.commit("s", Commit(ack=[taken[0].id]))
    assert await writer.depth("s") == 0


async def test_redis_recovers_when_the_stream_vanishes(
    redis_processes: Callable[[], RedisQueue], redis_server: Flushable
) -> None:
    """Redis restarted without its data (or the key was deleted): reads must not fail forever."""
    queue = redis_processes()
    assert await queue.read("s", "c1", 10, 0.02) == []  # the consumer group now exists and is remembered
    redis_server.flush()
    await queue.add("s", [b"after the loss"])
    entries: list[Entry] = []
    for _ in range(3):
        entries = await queue.read("s", "c1", 10, 0.05)
        if entries:
            break
    assert payloads_of(entries) == [b"after the loss"]

    blocked = asyncio.create_task(queue.read("s", "c1", 10, 2.0))
    await asyncio.sleep(0.1)
    redis_server.flush()  # deletes the stream under a blocked read
    assert await asyncio.wait_for(blocked, 3.0) == []
    await queue.add("s", [b"again"])
    assert payloads_of(await read_all(queue, "s")) == [b"again"]


async def test_read_on_empty_stream_blocks_up_to_block_seconds(steady_queue: WorkQueue) -> None:
    await warmed(steady_queue, "s")
    started = time.monotonic()
    assert await steady_queue.read("s", "c1", 10, 0.3) == []
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.0


async def test_read_with_entries_waiting_does_not_block(steady_queue: WorkQueue) -> None:
    await warmed(steady_queue, "s")
    await steady_queue.add("s", [b"ready"])
    started = time.monotonic()
    assert payloads_of(await steady_queue.read("s", "c1", 10, 5.0)) == [b"ready"]
    assert time.monotonic() - started < 0.5


async def test_blocked_read_wakes_up_when_an_entry_arrives(steady_queue: WorkQueue) -> None:
    await warmed(steady_queue, "s")
    reader = asyncio.create_task(steady_queue.read("s", "c1", 10, 5.0))
    await asyncio.sleep(0.1)
    assert not reader.done()
    started = time.monotonic()
    await steady_queue.add("s", [b"wake"])
    entries = await asyncio.wait_for(reader, 2.0)
    assert payloads_of(entries) == [b"wake"]
    assert time.monotonic() - started < 1.0


@pytest.mark.slow  # five rounds of resting half a second
async def test_an_idle_reader_is_woken_at_once_by_work_its_own_process_adds(steady_queue: WorkQueue) -> None:
    # A fan-out adding delivery jobs in a worker: that worker's delivery reader, resting between reads
    # of an empty stream (Redis: up to 0.2 s), takes them without waiting out its rest.
    await warmed(steady_queue, "s")
    waits = []
    for round_number in range(5):
        reader = asyncio.create_task(steady_queue.read("s", "c1", 10, 5.0))
        await asyncio.sleep(0.5 + 0.03 * round_number)  # long enough for the rests to reach their longest
        started = time.monotonic()
        await steady_queue.add("s", [b"job"])
        assert payloads_of(await asyncio.wait_for(reader, 2.0)) == [b"job"]
        waits.append(time.monotonic() - started)
    assert sorted(waits)[2] < 0.05, waits


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
    held_since = time.monotonic()
    taken = await queue.read("s", "crashed", 10, 0.05)
    assert payloads_of(taken) == [b"a", b"b", b"c"]

    # Another consumer asking all along gets nothing before the reclaim period, then the same
    # entries, same ids. (Times are taken after each read, so a stalled machine only delays them.)
    reclaimed, found_at = await first_found(queue, "s", "other", RECLAIM + 2.0)
    assert found_at - held_since >= RECLAIM, f"handed out again after {found_at - held_since:.2f} s"
    assert [(e.id, e.payload) for e in reclaimed] == [(e.id, e.payload) for e in taken]

    # Now held afresh by "other": nobody else gets them until the period has passed again.
    again = await queue.read("s", "crashed", 10, 0.02)
    assert again == [] or time.monotonic() - found_at >= RECLAIM, payloads_of(again)
    await queue.commit("s", Commit(ack=[e.id for e in reclaimed]))
    assert await queue.depth("s") == 0


async def test_reclaimed_entries_come_before_new_ones_and_respect_count(queue: WorkQueue) -> None:
    await queue.add("s", [b"old1", b"old2"])
    await queue.read("s", "crashed", 10, 0.05)
    await queue.add("s", [b"new1", b"new2"])
    await asyncio.sleep(RECLAIM + 0.1)
    first = await queue.read("s", "other", 3, 0.05)
    assert payloads_of(first) == [b"old1", b"old2", b"new1"]
    # Read with the others, it waits in the process for the next read; a read later than half the
    # reclaim period leaves it to the reclaim instead, so it comes either way.
    rest, _ = await first_found(queue, "s", "other", RECLAIM + 2.0)
    assert payloads_of(rest) == [b"new2"]


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


def follow_up(ack: list[str], due: float) -> Commit:
    commit = Commit(ack=ack, delay=[Delayed("retry", b"later", due), Delayed("retry", b"keyed", due, "k", 1)])
    commit.add_to("out", b"o1")
    return commit


async def test_a_commit_sent_again_adds_and_delays_nothing_twice(steady_queue: WorkQueue) -> None:
    # A worker sends again a commit that failed (or whose answer was lost in a failover): the entries
    # are acknowledged once and their follow-up work is queued once.
    q = steady_queue
    await q.add("in", [b"a", b"b"])
    entries = await q.read("in", "c1", 10, 0.05)
    due = time.time() + 3600
    await q.commit("in", follow_up([entries[0].id], due))
    await q.commit_each("in", [follow_up([entries[0].id], due), follow_up([entries[0].id], due)])
    assert await q.depth("out") == 1
    assert await q.delayed_count() == 2
    assert await q.depth("in") == 1  # b, in flight
    # A commit that still acknowledges one of its entries brings all its work.
    await q.commit("in", follow_up([entries[0].id, entries[1].id], due))
    assert await q.depth("out") == 2
    assert await q.depth("in") == 0


async def test_a_commit_of_thousands_of_entries_acknowledges_each_once(steady_queue: WorkQueue) -> None:
    # The script acknowledges in chunks of a thousand ids.
    q = steady_queue
    await q.add("in", [b"%04d" % i for i in range(2500)])
    entries = await read_all(q, "in")
    assert len(entries) == 2500
    due = time.time() + 3600
    for _ in range(2):
        await q.commit("in", follow_up([e.id for e in entries], due))
    assert (await q.depth("in"), await q.depth("out"), await q.delayed_count()) == (0, 1, 2)


async def test_a_late_commit_of_entries_reclaimed_and_committed_by_another_adds_nothing(
    queue: WorkQueue,
) -> None:
    await queue.add("s", [b"a"])
    held_since = time.monotonic()
    taken = await queue.read("s", "stalled", 10, 0.05)
    reclaimed, found_at = await first_found(queue, "s", "other", RECLAIM + 2.0)
    assert found_at - held_since >= RECLAIM and [e.id for e in reclaimed] == [e.id for e in taken]
    due = time.time() + 3600
    await queue.commit("s", follow_up([reclaimed[0].id], due))  # the one that took it over
    await queue.commit("s", follow_up([taken[0].id], due))  # the stalled one, done at last
    assert (await queue.depth("out"), await queue.delayed_count()) == (1, 2)


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


@pytest.mark.slow
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


# ---- partitions ----------------------------------------------------------------------------------------


async def test_reads_take_the_partitions_asked_for_and_entries_keep_theirs(make_queue: MakeQueue) -> None:
    q = await make_queue(LONG_RECLAIM, 8)
    assert q.partitions == 8
    await q.add_each("s", {0: [b"zero"], 3: [b"three-a", b"three-b"], 7: [b"seven"]})
    taken = await q.read("s", "c1", 10, 0.05, [3, 7])
    assert sorted((e.partition, e.payload) for e in taken) == [
        (3, b"three-a"),
        (3, b"three-b"),
        (7, b"seven"),
    ]
    assert await q.read("s", "c1", 10, 0.05, [3, 7]) == []
    assert [(e.partition, e.payload) for e in await q.read("s", "c1", 10, 0.05)] == [(0, b"zero")]
    assert await q.depth("s") == 4  # summed over the partitions, in flight included
    await q.commit_each("s", [Commit(ack=[e.id], partition=e.partition) for e in taken])
    assert await q.depth("s") == 1


async def test_each_commit_lands_in_its_own_partition(make_queue: MakeQueue) -> None:
    q, now = await make_queue(LONG_RECLAIM, 8), time.time()
    await q.add_each("in", {1: [b"a"], 2: [b"b"]})
    entries = {e.partition: e for e in await q.read("in", "c1", 10, 0.05)}
    first = Commit(ack=[entries[1].id], add={"out": [b"from 1"]}, partition=1)
    second = Commit(
        ack=[entries[2].id], delay=[Delayed("out", b"later from 2", now - 1, "k", 1)], partition=2
    )
    await q.commit_each("in", [first, second])
    assert await q.depth("in") == 0
    assert payloads_of(await q.read("out", "c1", 10, 0.05, [2])) == []
    assert [(e.partition, e.payload) for e in await q.read("out", "c1", 10, 0.05, [1])] == [(1, b"from 1")]
    assert await q.promote_due(now, 10, [1]) == 0  # the retry waits in partition 2
    assert await q.delayed_count() == 1
    assert await q.promote_due(now, 10, [2]) == 1
    assert [(e.partition, e.payload) for e in await q.read("out", "c1", 10, 0.05)] == [(2, b"later from 2")]


async def test_an_id_names_an_entry_within_its_partition_only(make_queue: MakeQueue) -> None:
    """Entries added to several partitions in one millisecond share ids (each partition's stream
    numbers its entries by the millisecond, then a sequence of its own): an entry is its partition
    and its id together, and acknowledging one leaves the others with that id in flight."""
    q = await make_queue(LONG_RECLAIM, 8)
    for _ in range(50):  # one add to eight partitions; a millisecond's edge can split one, not fifty
        await q.add_each("s", {p: [b"%d" % p] for p in range(8)})
        entries = await read_all(q, "s")
        assert len(entries) == 8
        same_id = [e for e in entries if e.id == entries[0].id]
        if len(same_id) > 1:
            break
        await q.commit_each("s", [Commit(ack=[e.id], partition=e.partition) for e in entries])
    assert len(same_id) > 1, "no two partitions' entries shared an id in 50 adds"
    await q.commit("s", Commit(ack=[same_id[0].id], partition=same_id[0].partition))
    assert await q.depth("s") == 7
    await q.commit("s", Commit(ack=[same_id[1].id], partition=same_id[1].partition))
    assert await q.depth("s") == 6


async def test_promotion_takes_the_earliest_due_across_partitions(make_queue: MakeQueue) -> None:
    q, now = await make_queue(LONG_RECLAIM, 8), time.time()
    await q.commit_each(
        "in",
        [
            Commit(delay=[Delayed("s", b"third", now - 1)], partition=5),
            Commit(delay=[Delayed("s", b"first", now - 3), Delayed("s", b"fourth", now - 0.5)], partition=6),
            Commit(delay=[Delayed("s", b"second", now - 2)], partition=7),
        ],
    )
    assert await q.promote_due(now, 2) == 2
    assert sorted(payloads_of(await q.read("s", "c1", 10, 0.05))) == [b"first", b"second"]
    assert await q.promote_due(now, 10) == 2
    assert sorted(payloads_of(await q.read("s", "c1", 10, 0.05))) == [b"fourth", b"third"]


async def test_a_queue_made_with_another_partition_count_refuses_to_start(redis_server: Flushable) -> None:
    first = RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM, partitions=64)
    other = RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM, partitions=32)
    same = RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM, partitions=64)
    try:
        await first.start()  # the first to use the queue records its count
        with pytest.raises(PartitionCountMismatch) as refused:
            await other.start()
        assert str(refused.value).startswith(
            "XMTP_PUSH_QUEUE_PARTITIONS: the queue in Redis has 64 partitions"
        )
        await same.start()
        await same.add("s", [b"fine"])
        assert await same.depth("s") == 1
    finally:
        for queue in (first, other, same):
            await queue.close()


async def test_scripts_forgotten_by_the_server_are_loaded_again(
    redis_processes: Callable[[], RedisQueue],
) -> None:
    """A restarted server, or a replica just promoted, may not know the scripts."""
    q = redis_processes()
    await q.add("s", [b"before"])
    await (await q.link.client()).script_flush()
    await q.add("s", [b"after"])
    entries = await q.read("s", "c1", 10, 0.05)
    assert payloads_of(entries) == [b"before", b"after"]
    await (await q.link.client()).script_flush()
    await q.commit("s", Commit(ack=[e.id for e in entries]))
    assert await q.depth("s") == 0


async def test_calls_wait_for_a_connection_rather_than_fail(redis_server: Flushable) -> None:
    queue = RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM, max_connections=2)
    try:
        await asyncio.gather(*(queue.add("s", [b"%d" % n], n % 8) for n in range(60)))
        assert await queue.depth("s") == 60
    finally:
        await queue.close()


async def test_the_start_up_log_tells_single_or_cluster_without_the_url(
    redis_server: Flushable, caplog: pytest.LogCaptureFixture
) -> None:
    queue = RedisQueue.from_url(redis_server.url, reclaim_seconds=RECLAIM)
    try:
        with caplog.at_level(logging.INFO, logger="app.queue.redis_link"):
            await queue.start()
    finally:
        await queue.close()
    said = [r.getMessage() for r in caplog.records if r.name == "app.queue.redis_link"]
    on_cluster = isinstance(redis_server, ClusterUnderTest)
    assert said == ["redis: cluster, 3 primaries" if on_cluster else "redis: single"]
    assert queue.link.cluster is on_cluster


async def test_partitions_spread_over_every_primary_of_a_cluster(redis_cluster: ClusterUnderTest) -> None:
    redis_cluster.flush()
    queue = RedisQueue.from_url(redis_cluster.url, reclaim_seconds=LONG_RECLAIM)
    try:
        await queue.add_each("s", {p: [b"%d" % p] for p in range(queue.partitions)})
        nodes = {
            redis_cluster.client.get_node_from_key(stream_key("s", p)).name for p in range(queue.partitions)
        }
        assert len(nodes) == redis_cluster.primaries() == 3
        entries = await read_all(queue, "s")
        assert sorted(e.partition for e in entries) == list(range(queue.partitions))
        assert all(e.payload == b"%d" % e.partition for e in entries)
        await queue.commit_each("s", [Commit(ack=[e.id], partition=e.partition) for e in entries])
        assert await queue.depth("s") == 0
    finally:
        await queue.close()


async def test_a_primary_killed_once_its_replica_caught_up_loses_nothing(
    redis_cluster: ClusterUnderTest,
) -> None:
    """kill -9 of the primary holding partition 0 while work is added to it: the replica takes over,
    the queue rides the failover out (the adds, retried as a worker loop does), nothing is lost."""
    redis_cluster.flush()
    queue = RedisQueue.from_url(redis_cluster.url, reclaim_seconds=LONG_RECLAIM)
    try:
        async with killable_primary(redis_cluster, stream_key("s", 0)) as victim:
            before = {p: [b"before-%d" % p] for p in range(queue.partitions)}
            await queue.add_each("s", before)
            victim.kill()  # once every write is on its replica
            during = [b"during-%d" % n for n in range(20)]
            for payload in during:
                await add_through_outage(queue, payload)
            expected = sorted([*(p for ps in before.values() for p in ps), *during])
            assert sorted(payloads_of(await read_all(queue, "s"))) == expected
    finally:
        await queue.close()


async def add_through_outage(queue: RedisQueue, payload: bytes, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await queue.add("s", [payload], 0)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
