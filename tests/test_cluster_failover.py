"""A Redis Cluster primary killed with kill -9 mid-run, once its replica caught up: no hint is lost.

The API (HTTP ingest, gRPC registration) and the fan-out and delivery workers run in this event loop
on PostgreSQL and the test Redis Cluster; recipients are webhooks on a local receiver that holds each
request a little, so deliveries are in flight. Envelopes are ingested continuously, half of them on
topics whose partitions one primary holds. Once hints flow and that primary's partitions hold work
read and not acknowledged, every primary's replica is let catch up (`WAIT`) and the busy primary is
killed. Its replica takes its slots over; ingest rides the failover out or answers 503, and then the
caller sends again (as the listener does); the workers ride it out and the entries the primary's
partitions held are reclaimed. Every expected hint must arrive; a hint may be sent twice only if the
failover interrupted it, and nothing is logged as an error: a failover is an outage, told as one.
The node is started again afterwards and rejoins as a replica.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from typing import Any

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError

from app.ops.failures import REDIS_UNREACHABLE, outage
from app.queue.base import ENVELOPES, delivery_stream, partition_of
from app.queue.redis_calls import GROUP, stream_key
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.pipeline import Pipeline, Stack, envelope, group_topic, running_pipeline, wait_until
from tests.support.redis_cluster import SETTLE_SECONDS, ClusterUnderTest, HealthWatch, killable_primary

cluster_postgresql_stack = pipeline_support.cluster_postgresql_stack

PARTITIONS = 64  # the default count
RECIPIENTS = 30
TOPICS = 6  # half of them in partitions of the primary that is killed
STEPS = 60  # one envelope every STEP_SECONDS
STEP_SECONDS = 0.1
KILL_AFTER = 60  # answered requests before the kill
RECEIVER_DELAY = 0.3  # each webhook request is held this long, so deliveries are in flight
IN_FLIGHT = 5  # delivery entries the killed primary's partitions hold, read and not acknowledged
RECLAIM_SECONDS = 2.0
INGEST_SECONDS = 30  # an envelope refused (503) is accepted this long after the cluster is healthy again
# A repeated hint was first sent within this window around the failover (seconds before the kill,
# after the cluster last turned healthy: the queue's client finds the new primary).
INTERRUPTED_BEFORE = 1.0
SETTLED_AFTER = 2.0
STREAMS = (ENVELOPES, delivery_stream("http"))


def node_of(client: RedisCluster, topic: bytes) -> str:
    return str(client.get_node_from_key(stream_key(ENVELOPES, partition_of(topic, PARTITIONS))).name)


def split_topics(client: RedisCluster) -> tuple[str, list[bytes]]:
    """A primary and TOPICS group topics, every other one in a partition that primary holds."""
    first = group_topic()
    victim = node_of(client, first)
    chosen: list[list[bytes]] = [[first], []]
    while min(len(c) for c in chosen) < TOPICS // 2:
        topic = group_topic()
        side = chosen[0] if node_of(client, topic) == victim else chosen[1]
        if len(side) < TOPICS // 2:
            side.append(topic)
    return victim, [topic for pair in zip(*chosen, strict=True) for topic in pair]


def pending_in(client: RedisCluster, partitions: set[int]) -> dict[str, int]:
    """Entries read and not acknowledged, per stream, in the given partitions."""
    counts: dict[str, int] = {}
    for stream in STREAMS:
        counts[stream] = 0
        for p in partitions:
            key = stream_key(stream, p)
            if client.exists(key):
                counts[stream] += int(client.xpending(key, GROUP)["pending"])
    return counts


async def ingest_until_accepted(
    pipe: Pipeline, batch: list[dict[str, Any]], refusals: Counter[int], watch: HealthWatch
) -> None:
    """Ingest, sending again while the queue is unavailable (503), as the listener does: accepted
    within INGEST_SECONDS of the first try, or of the cluster turning healthy after the kill."""
    first = time.monotonic()
    while True:
        response = await pipe.ingest(batch)
        if response.status_code == 202:
            assert response.json()["accepted"] == len(batch), response.text
            return
        assert response.status_code == 503, response.text
        refusals[response.status_code] += 1
        now = time.monotonic()
        assert now < max(first, watch.healthy_since()) + INGEST_SECONDS, (
            f"ingest refused for {INGEST_SECONDS} s of a healthy cluster (after the kill: {watch.story()})"
        )
        assert now < max(first, watch.started) + SETTLE_SECONDS, (
            f"the cluster did not settle: {watch.story()}"
        )
        await asyncio.sleep(0.1)


async def test_a_primary_killed_mid_run_once_its_replica_caught_up_loses_no_hint(
    cluster_postgresql_stack: Stack,
    redis_cluster: ClusterUnderTest,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    stack = cluster_postgresql_stack
    client = redis_cluster.client
    victim_name, topics = split_topics(client)
    busy = {partition_of(topic, PARTITIONS) for topic in topics[0::2]}  # the victim's partitions
    busy_key = stream_key(ENVELOPES, partition_of(topics[0], PARTITIONS))
    settings = {"queue_reclaim_seconds": RECLAIM_SECONDS, "fanout_page_size": 4}
    async with (
        killable_primary(redis_cluster, busy_key) as victim,
        running_pipeline(stack, **settings) as pipe,
        HealthWatch(victim) as watch,
    ):
        assert victim.name == victim_name

        endpoint = functools.partial(receiver.endpoint, delays=[RECEIVER_DELAY])
        subscribers = await pipe.members_on_neighbours(endpoint, topics, RECIPIENTS)

        kill: dict[str, Any] = {}
        step_now = 0

        async def kill_mid_run() -> None:
            await wait_until(lambda: len(receiver.all_requests()) >= KILL_AFTER, 20, "the first hints")
            deadline = time.monotonic() + 5
            while True:
                # No await from this look to the kill: nothing in this process writes in between.
                held = pending_in(client, busy)
                if held[delivery_stream("http")] >= IN_FLIGHT:
                    break
                assert time.monotonic() < deadline, "the busy primary never held deliveries in flight"
                await asyncio.sleep(0.005)
            victim.kill()
            watch.start()
            kill.update(at=time.monotonic(), step=step_now, held=held, received=len(receiver.all_requests()))
            await watch.wait_until(
                lambda: watch.healthy, SETTLE_SECONDS, "the replica to take the slots over"
            )
            kill["recovered"] = time.monotonic()

        killer = asyncio.create_task(kill_mid_run())
        refusals: Counter[int] = Counter()
        ingests: list[asyncio.Task[None]] = []
        expected: set[tuple[bytes, int, bytes]] = set()
        started = time.monotonic()
        try:
            for step in range(STEPS):
                step_now = step
                topic, sequence = topics[step % TOPICS], step + 1
                expected.update((topic, sequence, rid) for rid in subscribers[topic])
                # Each envelope its own call: the other primaries' partitions take envelopes while
                # the killed one's wait for its replica.
                ingests.append(
                    asyncio.create_task(
                        ingest_until_accepted(pipe, [envelope(topic, sequence)], refusals, watch)
                    )
                )
                await asyncio.sleep(max(0.0, started + (step + 1) * STEP_SECONDS - time.monotonic()))
            await killer
            await asyncio.gather(*ingests)
        finally:
            for task in (killer, *ingests):
                task.cancel()
            await asyncio.gather(killer, *ingests, return_exceptions=True)
        assert kill["step"] < STEPS - 1, "the kill came after the last envelope, not mid-run"

        def received() -> set[tuple[bytes, int, bytes]]:
            pipe.check_workers()  # the workers ride the failover out: they never stop
            return {r.hint for r in receiver.all_requests() if r.answered}

        await watch.wait_until(
            lambda: expected <= received(),
            30,
            f"{len(expected)} hints ({len(expected - received())} missing)",
        )
        took_over = time.monotonic() - kill["at"]
        await pipe.settled(receiver, timeout=20)

        # The replica took the killed primary's slots over.
        client.nodes_manager.initialize()
        assert client.get_node_from_key(busy_key).name != victim.name

        answered = [r for r in receiver.all_requests() if r.answered]
        copies = Counter(r.hint for r in answered)
        missing = expected - set(copies)
        assert not missing, f"{len(missing)} of {len(expected)} hints never arrived"
        assert set(copies) == expected, "hints nobody should have received"
        duplicates = len(answered) - len(copies)
        held = kill["held"]
        print(
            f"\nprimary failover: {len(expected)} hints expected, {len(answered)} answered, {duplicates}"
            f" duplicates; killed after {kill['received']} requests at step {kill['step']} of {STEPS} with"
            f" {held[ENVELOPES]} envelope and {held[delivery_stream('http')]} delivery entries in flight on"
            f" it; the cluster served its slots again {kill['recovered'] - kill['at']:.1f} s after the kill;"
            f" ingest refused {refusals[503]} times; all delivered {took_over:.1f} s after the kill (cluster after"
            f" the kill: {watch.story()})"
        )
        # Duplicates are bounded: only what the failover interrupted is sent again, once. A delivery
        # repeats when its acknowledgement could not be written: it was in flight on the killed
        # primary, or it finished while the cluster answered CLUSTERDOWN (every node does, between
        # the primary marked failed and its replica promoted). So a repeated hint was first sent
        # around the kill or during the failover, never well before it nor once it was over.
        first: dict[tuple[bytes, int, bytes], float] = {}
        for r in answered:
            first.setdefault(r.hint, r.at)
        window = (kill["at"] - INTERRUPTED_BEFORE, watch.healthy_since() + SETTLED_AFTER)
        repeated = [hint for hint, n in copies.items() if n > 1]
        outside = [h for h in repeated if not window[0] <= first[h] <= window[1]]
        assert not outside, f"{len(outside)} hints sent again that the failover did not interrupt"
        assert max(copies.values()) <= 2, "a hint sent more than twice"
        # A failover is an outage, told as one (Redis unavailable, then available again), never an
        # error: nothing in the API or the workers failed in a way they did not expect.
        # Our loggers only: a library's line here comes from an earlier test's clients in this process.
        ours = [r for r in caplog.records if r.name.split(".")[0] in ("app", "workers")]
        errors = [f"{r.name}: {r.getMessage()}" for r in ours if r.levelno >= logging.ERROR]
        assert not errors, errors


def test_a_cluster_failing_over_is_a_redis_outage_not_a_bug() -> None:
    """What a cluster answers between a primary lost and its replica promoted is told as Redis not
    serving (once per change, by the loops and the ingest route), never logged as a failure; and as
    the cluster's state, not as a network fault, since its nodes answer."""
    told = {
        ClusterDownError("The cluster is down"): "the Redis Cluster answers CLUSTERDOWN (a slot has no"
        " primary serving it: a failover under way, or a node holding a slot open)",
        TryAgainError("Multiple keys request during rehashing of slot"): "the Redis Cluster answers"
        " TRYAGAIN (a slot is being moved)",
        SlotNotCoveredError("slot not covered"): "the Redis Cluster leaves a slot without a node",
    }
    for error, problem in told.items():
        failure = outage(error)
        assert failure is not None and failure.code == REDIS_UNREACHABLE, type(error).__name__
        assert failure.message == f"XMTP_PUSH_REDIS_URL: {problem}"
