"""The node-go listener against a node over real gRPC: what it counts, queues, says and reports.

Contract: docs/legacy.md#from-envelope-to-push (the source), docs/operations.md#metrics (its metrics),
docs/operations.md#when-something-is-down (its log lines). Each test runs `fakes.fake_node_go.FakeNodeGo` (the
`node_go` fixture) on a real port and the real `workers.node_go_listener.NodeGoListener` on the
in-process queue, and reads what reached the queue's `legacy.envelopes` stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.core.dependencies import DependencyLog
from app.legacy.jobs import LEGACY_ENVELOPES, LegacyEnvelope, LegacyFanoutJob
from app.queue.activity import NODE_GO, ActivityLog, ListenerState, MemoryActivityLog
from app.queue.memory import MemoryQueue
from fakes.fake_node_go import MALFORMED, FakeNodeGo, group_message, other_envelope, welcome_message
from tests.support.pipeline import wait_until
from tests.support.queues import FailingAdds
from workers.node_go_listener import STOP_FLUSH_SECONDS, NodeGoListener

WAIT = 10.0
UNREACHABLE = "XMTP_PUSH_NODE_GO_ADDRESS: the node is unreachable (UNAVAILABLE); retrying with backoff"
ANSWERS_AGAIN = "XMTP_PUSH_NODE_GO_ADDRESS: the node answers again"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def kinds() -> dict[str, float]:
    names = ("group_message", "welcome", "other", "malformed")
    return {kind: sample("xmtp_push_node_go_envelopes_total", kind=kind) for kind in names}


def state() -> tuple[float, float]:
    """The listener's state gauge and `dependency_up{dependency="node_go"}`."""
    return sample("xmtp_push_node_go_listener_state"), sample("xmtp_push_dependency_up", dependency="node_go")


def reconnects() -> float:
    return sample("xmtp_push_node_go_reconnects_total")


def expected(envelope: Any) -> LegacyEnvelope:
    """What the listener must queue for a node-go envelope, its key computed here by the contract."""
    topic, message = envelope.content_topic, envelope.message
    key = hashlib.sha1(topic.encode() + message, usedforsecurity=False).hexdigest()
    return LegacyEnvelope(topic, envelope.timestamp_ns, message, key)


@dataclass
class Running:
    node: FakeNodeGo
    listener: NodeGoListener
    queue: Any
    stop: asyncio.Event
    task: asyncio.Task[None]
    taken: list[LegacyEnvelope] = field(default_factory=list)

    async def queued(self, count: int) -> list[LegacyEnvelope]:
        """Everything queued so far, once at least `count` envelopes are."""
        while len(self.taken) < count:
            entries = await self.queue.read(LEGACY_ENVELOPES, "test", 1000, 0.05)
            self.taken += [LegacyFanoutJob.decode(entry.payload).envelope for entry in entries]
            assert not self.task.done(), "the listener stopped"
            assert asyncio.get_running_loop().time() < self.deadline, f"{len(self.taken)} of {count} queued"
        return self.taken

    @property
    def deadline(self) -> float:
        return self._deadline

    def start_clock(self) -> None:
        self._deadline = asyncio.get_running_loop().time() + WAIT

    async def open(self) -> None:
        await self.node.wait_for(lambda: self.node.open_streams == 1, WAIT, "the listener's stream")
        await wait_until(lambda: state() == (2, 1), WAIT, "the listener live")

    async def stopped(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, STOP_FLUSH_SECONDS + WAIT)


@asynccontextmanager
async def listening(
    node: FakeNodeGo, queue: Any = None, *, queues: bool = True, activity: ActivityLog | None = None
) -> AsyncIterator[Running]:
    queue = MemoryQueue(reclaim_seconds=60) if queue is None else queue
    listener = NodeGoListener(
        node.address, tls=False, queue=queue, dependencies=DependencyLog(), queues=queues, activity=activity
    )
    stop = asyncio.Event()
    running = Running(node, listener, queue, stop, asyncio.create_task(listener.run(stop)))
    running.start_clock()
    try:
        yield running
    finally:
        stop.set()
        await asyncio.gather(running.task, return_exceptions=True)


async def test_each_kind_is_counted_and_group_messages_and_welcomes_are_queued(node_go: FakeNodeGo) -> None:
    before = kinds()
    group = group_message(secrets.token_bytes(16), 7)
    welcome = welcome_message(secrets.token_bytes(32), 8)
    async with listening(node_go) as run:
        await run.open()
        assert await run.listener.stream_open()
        node_go.publish([group, other_envelope(), MALFORMED, welcome])
        assert await run.queued(2) == [expected(group), expected(welcome)]
        await wait_until(lambda: sum(kinds().values()) - sum(before.values()) == 4, WAIT, "all counted")
        after = kinds()
        assert {kind: after[kind] - before[kind] for kind in after} == dict.fromkeys(after, 1.0)
        await run.stopped()
    assert state() == (3, 1)  # stopped; the node answered until then
    assert not await run.listener.stream_open()


async def test_its_state_is_told_for_the_status_page_and_stats(node_go: FakeNodeGo) -> None:
    activity = MemoryActivityLog()
    async with listening(node_go, activity=activity) as run:
        await run.open()
        live = await _told(activity, "live")
        assert abs(live.updated - time.time()) < 60 and await activity.listener() is None  # not xmtpd's
        stamped = time.time_ns() - 3_000_000_000  # published by the node 3 s before it is read
        node_go.publish([group_message(secrets.token_bytes(16), 9, timestamp_ns=stamped)])
        await run.queued(1)
        await run.stopped()
    told = await activity.listener(NODE_GO)
    assert told is not None and told.state == "stopped" and 3 <= told.lag_seconds < 60, told


async def _told(activity: MemoryActivityLog, state: str) -> ListenerState:
    deadline = time.monotonic() + WAIT
    while (told := await activity.listener(NODE_GO)) is None or told.state != state:
        assert time.monotonic() < deadline, f"{state} not told: {told}"
        await asyncio.sleep(0.05)
    return told


async def test_a_group_topic_in_another_spelling_is_another_topic(node_go: FakeNodeGo) -> None:
    group_id = secrets.token_bytes(16)
    upper = other_envelope(f"/xmtp/mls/1/g-{group_id.hex().upper()}/proto")
    before = kinds()
    async with listening(node_go) as run:
        await run.open()
        node_go.publish([upper, group_message(group_id, 1)])
        assert [e.topic for e in await run.queued(1)] == [f"/xmtp/mls/1/g-{group_id.hex()}/proto"]
        assert kinds()["other"] - before["other"] == 1


@pytest.mark.slow
async def test_a_refused_batch_is_queued_again_and_nothing_is_dropped(node_go: FakeNodeGo) -> None:
    queue = FailingAdds(MemoryQueue(reclaim_seconds=60), LEGACY_ENVELOPES)
    queue.failing = True
    group_id = secrets.token_bytes(16)
    sent = [group_message(group_id, n) for n in range(1, 51)]
    async with listening(node_go, queue) as run:
        await run.open()
        node_go.publish(sent)
        await wait_until(lambda: queue.failed >= 3, WAIT, "adds refused")
        queue.failing = False
        assert sorted(await run.queued(len(sent)), key=lambda e: e.message) == sorted(
            map(expected, sent), key=lambda e: e.message
        )
        await asyncio.sleep(0.2)
        assert await queue.inner.read(LEGACY_ENVELOPES, "test", 1000, 0.0) == []  # each once


async def test_with_the_legacy_api_off_envelopes_are_counted_and_not_queued(
    node_go: FakeNodeGo, caplog: pytest.LogCaptureFixture
) -> None:
    before = kinds()
    with caplog.at_level(logging.WARNING, logger="workers.node_go_listener"):
        async with listening(node_go, queues=False) as run:
            await run.open()
            node_go.publish([group_message(secrets.token_bytes(16), 1)])
            await wait_until(lambda: kinds()["group_message"] > before["group_message"], WAIT, "counted")
            assert await run.queue.read(LEGACY_ENVELOPES, "test", 10, 0.1) == []
    assert any("XMTP_PUSH_LEGACY_API_ENABLED is not" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["abort", "end"])
async def test_a_broken_stream_is_reopened_and_what_follows_is_queued(node_go: FakeNodeGo, how: str) -> None:
    group_id = secrets.token_bytes(16)
    first, second = group_message(group_id, 1), group_message(group_id, 2)
    before = reconnects()
    async with listening(node_go) as run:
        await run.open()
        node_go.publish([first])
        await run.queued(1)
        assert node_go.drop_streams(how) == 1
        await node_go.wait_for(lambda: node_go.connections == 2 and node_go.open_streams == 1, WAIT, "again")
        assert reconnects() - before == 1
        node_go.publish([second])
        assert await run.queued(2) == [expected(first), expected(second)]


@pytest.mark.slow
async def test_an_unreachable_node_is_told_once_and_its_return_once(
    node_go: FakeNodeGo, caplog: pytest.LogCaptureFixture
) -> None:
    await node_go.go_away()
    before = reconnects()
    with caplog.at_level(logging.INFO, logger="workers.node_go_listener"):
        async with listening(node_go) as run:
            await wait_until(lambda: reconnects() - before >= 2, WAIT, "two failed attempts")
            assert state() == (0, 0)
            assert not await run.listener.stream_open()
            await node_go.come_back()
            await run.open()
            assert await run.listener.stream_open()
            envelope = group_message(secrets.token_bytes(16), 1)
            node_go.publish([envelope])
            assert await run.queued(1) == [expected(envelope)]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said.count(UNREACHABLE) == 1, said
    assert said.count(ANSWERS_AGAIN) == 1, said
    everything = " ".join(r.getMessage() for r in caplog.records)
    assert node_go.address not in everything and "/xmtp/mls" not in everything


@pytest.mark.slow
async def test_a_stop_while_the_queue_refuses_says_how_many_were_not_queued(
    node_go: FakeNodeGo, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FailingAdds(MemoryQueue(reclaim_seconds=60), LEGACY_ENVELOPES)
    queue.failing = True
    with caplog.at_level(logging.WARNING, logger="workers.node_go_listener"):
        async with listening(node_go, queue) as run:
            await run.open()
            node_go.publish([group_message(secrets.token_bytes(16), n) for n in range(3)])
            await wait_until(lambda: queue.failed >= 1, WAIT, "an add refused")
            await run.stopped()
    assert "3 node-go envelopes read were not queued before the listener stopped" in [
        r.getMessage() for r in caplog.records
    ]
