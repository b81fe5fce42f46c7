"""The xmtpd firehose listener end to end: a fake node over real gRPC, the real listener, workers and
webhooks to a local receiver.

Contract: docs/xmtp-network.md (firehose, catch-up, ids, commit detection), docs/configuration.md
(XMTPD_* settings), docs/operations.md#metrics (listener metrics). Each test runs, in this event loop: `fakes.fake_xmtpd.FakeXmtpd` on a real port, the
real `workers.listener.run_listener` with the in-process queue, `workers.runner.run_workers`, the real
API (recipients register and subscribe over gRPC with HTTP delivery) and an aiohttp receiver that
verifies every webhook with `standardwebhooks`. Hints are counted by (topic, sequence_id) per recipient.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from app.legacy import service as legacy_service
from app.legacy.commands import Mechanism, MechanismKind, RegisterInstallation, Subscribe
from app.network import repository
from app.ops.stats import listener_summary
from app.proto.xmtp.backend.v1 import notification_pb2 as npb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.proto.xmtp.mls.api.v1 import mls_pb2
from app.queue.activity import ListenerState
from app.queue.base import ENVELOPES, delivery_stream
from app.runtime import Runtime, open_runtime
from fakes.fake_xmtpd import (
    COMMIT,
    SENDER_EXTERNAL,
    SENDER_MEMBER,
    SENDER_NEW_MEMBER_COMMIT,
    SENDER_NEW_MEMBER_PROPOSAL,
    FakeXmtpd,
    Item,
    commit_message,
    garbage,
    group_message,
    group_topic,
    identity_update,
    key_package,
    private_message,
    proposal_message,
    welcome_message,
    welcome_topic,
)
from fakes.webhook_receiver import Receiver
from tests.support import clear_tables, make_settings
from tests.support.queues import FailingAdds
from workers.listener import PAGE_LIMIT, run_listener
from workers.runner import run_workers
from workers.server import running_api

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

KEEPALIVE_TIMEOUT = 1.0  # the listener's; the fake node sends keep-alives every 0.25 s unless told
WAIT = 15.0  # bound on every wait for hints


# --- metrics --------------------------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Metrics:
    """Counter deltas since construction."""

    NAMES = {
        "malformed": ("xmtp_push_listener_envelopes_total", {"kind": "malformed"}),
        "group_messages": ("xmtp_push_listener_envelopes_total", {"kind": "group_message"}),
        "duplicate": ("xmtp_push_listener_dropped_total", {"reason": "duplicate"}),
        "stale": ("xmtp_push_listener_dropped_total", {"reason": "stale"}),
        "not_pushable": ("xmtp_push_listener_dropped_total", {"reason": "not_pushable"}),
        "dropped_malformed": ("xmtp_push_listener_dropped_total", {"reason": "malformed"}),
        "reconnects": ("xmtp_push_listener_reconnects_total", {}),
        "catchup": ("xmtp_push_listener_catchup_envelopes_total", {}),
        "ingested": ("xmtp_push_envelopes_total", {"result": "ingested"}),
    }

    def __init__(self) -> None:
        self.start = {key: sample(name, **labels) for key, (name, labels) in self.NAMES.items()}

    def __getitem__(self, key: str) -> float:
        name, labels = self.NAMES[key]
        return sample(name, **labels) - self.start[key]


# --- the webhook receiver -------------------------------------------------------------------------


@dataclass
class Member:
    rid: bytes
    secret: bytes
    path: str
    key: bytes


def hints_at(receiver: Receiver, path: str) -> list[tuple[bytes, int]]:
    """(topic, sequence_id) of every verified webhook to `path`, in arrival order."""
    return [(topic, sequence_id) for topic, sequence_id, _ in receiver.endpoints[path].hints()]


# --- the harness ----------------------------------------------------------------------------------


@dataclass
class Harness:
    fake: FakeXmtpd
    runtime: Runtime
    stub: notification_pb2_grpc.NotificationServiceStub
    receiver: Receiver
    _listener: asyncio.Task[None] | None = None
    _listener_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _workers: asyncio.Task[None] | None = None
    _workers_stop: asyncio.Event = field(default_factory=asyncio.Event)

    # recipients, over real gRPC

    async def member(self, *topics: bytes, commits: bool = False) -> Member:
        endpoint = self.receiver.endpoint()
        member = Member(secrets.token_bytes(32), secrets.token_bytes(32), endpoint.path, endpoint.key)
        await self.stub.Register(
            npb.RegisterRequest(
                recipient_id=member.rid,
                recipient_secret=member.secret,
                http=npb.HttpDelivery(url=endpoint.url, signing_key=endpoint.key),
            ),
            timeout=10,
        )
        await self.stub.UpdateSubscriptions(
            npb.UpdateSubscriptionsRequest(
                recipient_id=member.rid,
                recipient_secret=member.secret,
                adds=[npb.Subscription(topic=t, include_commits=commits) for t in topics],
            ),
            timeout=10,
        )
        return member

    def hints(self, member: Member) -> list[tuple[bytes, int]]:
        return hints_at(self.receiver, member.path)

    # the listener and the workers

    def start_listener(self, runtime: Runtime | None = None) -> None:
        assert self._listener is None
        self._listener_stop = asyncio.Event()
        self._listener = asyncio.create_task(run_listener(runtime or self.runtime, self._listener_stop))

    async def stop_listener(self) -> float:
        """Set the stop event; the listener must return by itself, promptly. Returns how long it took."""
        task, self._listener = self._listener, None
        if task is None:
            return 0.0
        started = time.monotonic()
        self._listener_stop.set()
        done, _ = await asyncio.wait({task}, timeout=5.0)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise AssertionError("the listener did not stop within 5 s of its stop event")
        task.result()
        return time.monotonic() - started

    def start_workers(self) -> None:
        self._workers_stop = asyncio.Event()
        self._workers = asyncio.create_task(run_workers(self.runtime, self._workers_stop))

    async def stop_workers(self) -> None:
        task, self._workers = self._workers, None
        if task is None:
            return
        self._workers_stop.set()
        done, _ = await asyncio.wait({task}, timeout=0.05)  # read loops block up to 1 s
        if not done:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def check_tasks(self) -> None:
        for name, task in (("listener", self._listener), ("workers", self._workers)):
            if task is not None and task.done():
                raise AssertionError(f"the {name} stopped") from (
                    None if task.cancelled() else task.exception()
                )

    # waiting

    async def until(self, predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> float:
        started = time.monotonic()
        while not predicate():
            self.check_tasks()
            if time.monotonic() - started > timeout:
                raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
            await asyncio.sleep(0.01)
        return time.monotonic() - started

    async def connected(self, connections: int = 1, timeout: float = WAIT) -> None:
        """Until the fake has seen `connections` streams and one of them is open."""
        await self.until(
            lambda: self.fake.connections >= connections and self.fake.open_streams >= 1,
            f"stream #{connections} to open",
            timeout,
        )

    async def received(self, expected: dict[str, Iterable[tuple[bytes, int]]]) -> None:
        """Until every expected hint has arrived, then until the pipeline is quiet; then every recipient
        holds exactly its expected hints, each once."""
        wanted = {member: Counter(hints) for member, hints in expected.items()}

        def arrived() -> bool:
            return all(not (want - Counter(hints_at(self.receiver, m))) for m, want in wanted.items())

        await self.until(arrived, "the expected hints")
        await self.settled()
        for path, want in wanted.items():
            got = Counter(hints_at(self.receiver, path))
            assert got == want, {"missing": want - got, "extra": got - want}
        assert self.receiver.failures == [] and self.receiver.strays == []

    async def settled(self, timeout: float = WAIT) -> None:
        """Nothing queued or in flight on several looks in a row."""
        queue = self.runtime.queue
        assert queue is not None
        started, quiet = time.monotonic(), 0
        while quiet < 5:
            self.check_tasks()
            depths = [await queue.depth(ENVELOPES), await queue.depth(delivery_stream("http"))]
            quiet = 0 if any(depths) or await queue.delayed_count() else quiet + 1
            if time.monotonic() - started > timeout:
                raise AssertionError(f"pipeline did not settle: {depths}")
            await asyncio.sleep(0.03)

    # stored marks

    async def marks(self) -> dict[int, int]:
        async with self.runtime.sessions() as session:
            rows = await session.execute(text("SELECT originator_node_id, sequence_id FROM listener_cursors"))
            return {int(node): int(sequence) for node, sequence in rows}

    async def seed_marks(self, marks: dict[int, int]) -> None:
        async with self.runtime.sessions() as session, session.begin():
            await repository.save_marks(session, marks, time.time_ns())


@contextlib.asynccontextmanager
async def harness(
    database_url: str, *, keepalive_seconds: float = 0.25, listener: bool = True, **overrides: Any
) -> AsyncIterator[Harness]:
    values: dict[str, Any] = {
        "redis_url": None,
        "xmtpd_tls": False,
        "xmtpd_keepalive_timeout_seconds": KEEPALIVE_TIMEOUT,
        "retry_base_seconds": 0.05,
        # Only the webhook channel: APNs and FCM workers would have nothing to do.
        "apns_key": None,
        "fcm_service_account": None,
    }
    values.update(overrides)
    async with FakeXmtpd(keepalive_seconds=keepalive_seconds) as fake, Receiver() as receiver:
        settings = make_settings(database_url, xmtpd_address=fake.address, **values)
        async with open_runtime(settings, in_process_queue=True) as runtime:
            await clear_tables(runtime)
            async with runtime.engine.begin() as connection:
                await connection.execute(text("DELETE FROM listener_cursors"))
            async with running_api(runtime) as servers:
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{servers.grpc_port}")
                h = Harness(fake, runtime, notification_pb2_grpc.NotificationServiceStub(channel), receiver)
                try:
                    h.start_workers()
                    if listener:
                        h.start_listener()
                    yield h
                    assert receiver.failures == [] and receiver.strays == []
                finally:
                    with contextlib.suppress(AssertionError):
                        await h.stop_listener()
                    await h.stop_workers()
                    await channel.close()


def keys_of(items: Sequence[Item]) -> list[tuple[bytes, int]]:
    return [(item.topic, item.sequence_id) for item in items]


# --- the core flow: a mid-stream disconnect -------------------------------------------------------


async def disconnect_flow(h: Harness, how: str) -> None:
    g1, g2, g3, w1 = group_topic(), group_topic(), group_topic(), welcome_topic()
    a = await h.member(g1, g2, w1)
    b = await h.member(g2)
    metrics = Metrics()
    await h.connected()
    # Sequence ids are per originator; node 200's are kept apart from node 100's because a hint is
    # identified by (topic, sequence_id) only.
    phase1 = [
        group_message(100, 1, g1, sender_hmac=secrets.token_bytes(32)),
        group_message(100, 2, g1),
        group_message(100, 3, g2),
        identity_update(100, 4),
        group_message(100, 5, g3),
        welcome_message(200, 1001, w1),
        key_package(200, 1002),
    ]
    assert h.fake.publish(phase1[:4]) == 1
    assert h.fake.publish(phase1[4:]) == 1
    a_hints = keys_of([phase1[0], phase1[1], phase1[2], phase1[5]])
    b_hints = keys_of([phase1[2]])
    await h.received({a.path: a_hints, b.path: b_hints})

    # The node drops the stream and turns the listener away for a while; what is published meanwhile
    # reaches the store only.
    h.fake.refuse_streams = True
    if how == "restart":
        await h.fake.restart()
    else:
        assert h.fake.drop_streams(how) == 1
    await h.until(lambda: h.fake.refused >= 1, "a refused reconnect")
    phase2 = [
        group_message(100, 6, g1),
        group_message(100, 7, g2),
        welcome_message(200, 1003, w1),
        group_message(200, 1004, g2),
        group_message(100, 8, g3),
    ]
    assert h.fake.publish(phase2) == 0  # nobody listening
    # Published as the next stream opens: both that stream and the catch-up query deliver it.
    overlap = [group_message(100, 9, g1)]
    h.fake.publish_on_next_stream(overlap)
    queries_before = len(h.fake.queries)
    h.fake.refuse_streams = False
    await h.connected(h.fake.refused + 2)
    phase3 = [group_message(100, 10, g2), group_message(200, 1005, g1)]
    assert h.fake.publish(phase3) == 1

    a_hints += keys_of([phase2[0], phase2[1], phase2[2], phase2[3], overlap[0], *phase3])
    b_hints += keys_of([phase2[1], phase2[3], phase3[0]])
    await h.received({a.path: a_hints, b.path: b_hints})

    # The catch-up asked each known originator from its high-water mark.
    catch_up = h.fake.queries[queries_before:]
    cursors = sorted((q.originator_node_ids, tuple(q.cursor.items())) for q in catch_up)
    assert cursors == [((100,), ((100, 5),)), ((200,), ((200, 1002),))], catch_up
    assert all(q.limit == PAGE_LIMIT for q in catch_up)
    # Each pushable envelope was queued once, the one seen twice was dropped once as a duplicate.
    pushable = [*phase1, *phase2, *overlap, *phase3]
    unique = {(i.node, i.sequence_id) for i in pushable if i.topic[0] in (0, 1)}
    assert metrics["ingested"] == len(unique)
    assert metrics["duplicate"] >= 1
    assert metrics["reconnects"] >= 1
    assert metrics["not_pushable"] == 2
    await h.stop_listener()
    assert await h.marks() == {100: 10, 200: 1005}


async def test_every_envelope_once_across_a_disconnect(database_url: str) -> None:
    async with harness(database_url) as h:
        await disconnect_flow(h, "abort")


@pytest.mark.parametrize("how", ["cancel", "end", "restart"])
async def test_every_kind_of_disconnect_is_caught_up(sqlite_url: str, how: str) -> None:
    async with harness(sqlite_url) as h:
        await disconnect_flow(h, how)


# --- catch-up -------------------------------------------------------------------------------------


async def test_catch_up_reads_every_page(sqlite_url: str) -> None:
    assert PAGE_LIMIT == 1000
    async with harness(sqlite_url, listener=False) as h:
        g1, g3 = group_topic(), group_topic()
        a = await h.member(g1)
        await h.seed_marks({100: 5, 200: 0})
        # Node 100: 2,345 envelopes after the mark, in three pages; every 200th is for the subscriber,
        # every 10th goes to a topic nobody follows, the rest are identity updates.
        backlog = []
        for sequence in range(6, 2350):
            if sequence % 200 == 0:
                backlog.append(group_message(100, sequence, g1))
            elif sequence % 10 == 0:
                backlog.append(group_message(100, sequence, g3))
            else:
                backlog.append(identity_update(100, sequence))
        backlog.append(group_message(100, 2350, g1))  # the very last one
        # Node 200: exactly one full page; the second answer is empty.
        node200 = [identity_update(200, s) for s in range(1, 1000)] + [
            welcome_message(200, 1000, welcome_topic())
        ]
        h.fake.add(backlog[:-1])
        h.fake.add([backlog[-1]])
        h.fake.add(node200)
        metrics = Metrics()
        h.start_listener()
        expected = keys_of([item for item in backlog if item.topic == g1])
        assert len(expected) == 12
        await h.received({a.path: expected})
        pages = [(q.originator_node_ids, q.cursor, q.limit, q.answered) for q in h.fake.queries]
        assert pages == [
            ((100,), {100: 5}, 1000, 1000),
            ((100,), {100: 1005}, 1000, 1000),
            ((100,), {100: 2005}, 1000, 345),
            ((200,), {200: 0}, 1000, 1000),
            ((200,), {200: 1000}, 1000, 0),
        ]
        assert metrics["catchup"] == 2345 + 1000
        await h.stop_listener()
        assert await h.marks() == {100: 2350, 200: 1000}


async def test_catch_up_skips_envelopes_older_than_the_max_age(sqlite_url: str) -> None:
    async with harness(sqlite_url, listener=False, xmtpd_catchup_max_age_seconds=30) as h:
        g1, w1 = group_topic(), welcome_topic()
        a = await h.member(g1, w1)
        await h.seed_marks({100: 0})
        now = time.time_ns()
        old, fresh = now - 3_600 * 10**9, now - 5 * 10**9
        backlog = [
            group_message(100, 1, g1, originator_ns=old),
            group_message(100, 2, g1, originator_ns=old),
            welcome_message(100, 3, w1, originator_ns=old),
            group_message(100, 4, g1, originator_ns=fresh),
            welcome_message(100, 5, w1, originator_ns=fresh),
            group_message(100, 6, g1, originator_ns=now - 31 * 10**9),  # just past the bound
        ]
        h.fake.add(backlog)
        metrics = Metrics()
        h.start_listener()
        await h.received({a.path: keys_of([backlog[3], backlog[4]])})
        assert metrics["stale"] == 4
        # The stale envelopes do not hold the mark back: they are never asked for again.
        await h.stop_listener()
        assert await h.marks() == {100: 6}


# --- keep-alives ----------------------------------------------------------------------------------


async def test_a_stream_with_regular_keepalives_is_kept(sqlite_url: str) -> None:
    async with harness(sqlite_url, keepalive_seconds=0.2) as h:
        g1 = group_topic()
        a = await h.member(g1)
        await h.connected()
        metrics = Metrics()
        await asyncio.sleep(2.5 * KEEPALIVE_TIMEOUT)  # idle but for keep-alives
        h.fake.publish([group_message(100, 1, g1)])
        await h.received({a.path: [(g1, 1)]})
        assert h.fake.connections == 1
        assert metrics["reconnects"] == 0


@pytest.mark.parametrize("silence", ["went_silent", "no_keepalives"])
async def test_a_silent_stream_is_reopened(sqlite_url: str, silence: str) -> None:
    keepalive = 0.2 if silence == "went_silent" else 0.0
    async with harness(sqlite_url, keepalive_seconds=keepalive) as h:
        g1 = group_topic()
        a = await h.member(g1)
        await h.connected()
        sent = time.monotonic()  # the stream's last word comes after this: hint 1, or a keep-alive
        h.fake.publish([group_message(100, 1, g1)])
        await h.received({a.path: [(g1, 1)]})
        metrics = Metrics()
        started = time.monotonic()
        if silence == "went_silent":
            assert h.fake.go_silent() == 1
            await asyncio.sleep(0.1)
            assert h.fake.publish([group_message(100, 2, g1)]) == 1  # lost on the silent stream
        else:
            h.fake.add([group_message(100, 2, g1)])
        await h.until(lambda: h.fake.connections >= 2, "a new stream", timeout=5.0)
        reopened = time.monotonic()
        # Not before the stream was silent for the timeout (its silence began after `sent`); soon
        # after it (a short backoff), counted from when the hint was seen.
        assert reopened - sent >= 0.95 * KEEPALIVE_TIMEOUT, reopened - sent
        assert reopened - started <= KEEPALIVE_TIMEOUT + 1.5, reopened - started
        assert metrics["reconnects"] >= 1
        # What the silent stream swallowed comes back through the catch-up.
        await h.received({a.path: [(g1, 1), (g1, 2)]})


# --- commits --------------------------------------------------------------------------------------


async def test_commits_are_told_apart_by_their_framing(sqlite_url: str) -> None:
    async with harness(sqlite_url) as h:
        g = group_topic()
        plain = await h.member(g)
        with_commits = await h.member(g, commits=True)
        await h.connected()
        application = group_message(100, 1, g, should_push=True)
        # A commit inside a PrivateMessage, flagged should_push: the framing decides, not the flag.
        private_commit = group_message(
            100, 2, g, data=private_message(COMMIT, group_id=g[1:]), should_push=True
        )
        silent_app = group_message(100, 3, g, should_push=False)
        items = [
            application,
            private_commit,
            silent_app,
            commit_message(0, 501, g, sender_type=SENDER_MEMBER),
            proposal_message(0, 502, g, sender_type=SENDER_EXTERNAL),
            proposal_message(0, 503, g, sender_type=SENDER_NEW_MEMBER_PROPOSAL),
            commit_message(0, 504, g, sender_type=SENDER_NEW_MEMBER_COMMIT),
        ]
        h.fake.publish(items)
        await h.received(
            {
                plain.path: [(g, 1)],
                with_commits.path: [(g, 1), (g, 2), (g, 501), (g, 502), (g, 503), (g, 504)],
            }
        )


# --- malformed envelopes --------------------------------------------------------------------------


async def test_garbage_in_a_batch_is_counted_and_skipped(sqlite_url: str) -> None:
    async with harness(sqlite_url) as h:
        g, w = group_topic(), welcome_topic()
        a = await h.member(g, w)
        await h.connected()
        metrics = Metrics()
        batch = [
            group_message(100, 1, g),
            garbage(100, 2, "unsigned"),
            group_message(100, 3, g),
            garbage(100, 4, "payer"),
            garbage(100, 5, "client"),
            garbage(100, 6, "no_topic"),
            welcome_message(100, 7, w),
        ]
        assert h.fake.publish(batch) == 1
        await h.received({a.path: [(g, 1), (g, 3), (w, 7)]})
        assert metrics["malformed"] == 4
        assert metrics["dropped_malformed"] == 4
        assert metrics["group_messages"] == 2
        assert h.fake.connections == 1  # the stream survived it


# --- marks ----------------------------------------------------------------------------------------


async def test_marks_are_stored_and_a_new_listener_catches_up_from_them(database_url: str) -> None:
    async with harness(database_url) as h:
        g, w = group_topic(), welcome_topic()
        a = await h.member(g, w)
        await h.connected()
        first = [group_message(100, s, g) for s in (1, 2, 3)] + [welcome_message(300, 700, w)]
        h.fake.publish(first)
        await h.received({a.path: keys_of(first)})
        assert await h.stop_listener() < 2.0
        assert await h.marks() == {100: 3, 300: 700}

        # Published while no listener runs.
        second = [group_message(100, s, g) for s in (4, 5, 6)] + [welcome_message(300, 701, w)]
        h.fake.add(second)
        queries_before = len(h.fake.queries)
        # A new listener, on a new runtime (a restarted process): it knows only what was stored.
        async with open_runtime(h.runtime.settings, in_process_queue=True) as fresh:
            h.start_listener(replace(fresh, queue=h.runtime.queue))
            await h.received({a.path: keys_of(first + second)})
            restart_queries = sorted(
                (q.originator_node_ids, q.cursor) for q in h.fake.queries[queries_before:]
            )
            assert restart_queries == [((100,), {100: 3}), ((300,), {300: 700})]
            await h.stop_listener()
        assert await h.marks() == {100: 6, 300: 701}


async def test_a_mark_never_moves_back(database_url: str) -> None:
    async with harness(database_url, listener=False) as h:
        await h.seed_marks({1: 50, 2: 7})
        await h.seed_marks({1: 40, 2: 9, 3: 0})
        assert await h.marks() == {1: 50, 2: 9, 3: 0}


# --- failures on our side -------------------------------------------------------------------------


async def test_envelopes_that_could_not_be_queued_are_caught_up_later(sqlite_url: str) -> None:
    async with harness(sqlite_url, listener=False) as h:
        g = group_topic()
        a = await h.member(g)
        queue = FailingAdds(h.runtime.queue, ENVELOPES)
        h.start_listener(replace(h.runtime, queue=queue))
        await h.connected()
        h.fake.publish([group_message(100, 1, g)])
        await h.received({a.path: [(g, 1)]})
        queue.failing = True
        h.fake.publish([group_message(100, 2, g), group_message(100, 3, g)])
        await h.until(lambda: queue.failed >= 1, "a failed enqueue")
        queue.failing = False
        # The listener reconnects and catches up from its mark, which never covered 2 and 3.
        await h.received({a.path: [(g, 1), (g, 2), (g, 3)]})
        await h.stop_listener()
        assert await h.marks() == {100: 3}


async def test_a_cancelled_listener_task_ends(sqlite_url: str) -> None:
    async with harness(sqlite_url, listener=False) as h:
        stop = asyncio.Event()
        task = asyncio.create_task(run_listener(h.runtime, stop))
        try:
            await h.until(lambda: h.fake.open_streams == 1, "the stream")
            await asyncio.sleep(0.1)  # waiting for the next response
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=3.0)
            assert done, "the listener ignored its cancellation"
            assert task.cancelled()
            # Not a clean stop: its last state stays, and goes stale on /status and in `stats`.
            state = await reported(h.runtime)
            assert state is not None and state.state != "stopped"
            words, level = listener_summary(state, state.updated + 600)
            assert (words.startswith("not reporting for 600 s"), level) == (True, "bad")
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=3.0)


async def reported(runtime: Runtime) -> ListenerState | None:
    assert runtime.activity is not None
    return await runtime.activity.listener()


async def test_a_clean_stop_is_told_as_stopped_not_as_silence(sqlite_url: str) -> None:
    async with harness(sqlite_url) as h:
        await h.connected()
        started = time.monotonic()
        while (state := await reported(h.runtime)) is None or state.state != "live":
            assert time.monotonic() - started < WAIT, f"the listener did not report live: {state}"
            await asyncio.sleep(0.02)
        assert listener_summary(state, state.updated + 600)[1] == "bad"  # live, then silent: trouble
        await h.stop_listener()
        stopped = await reported(h.runtime)
        assert stopped is not None and stopped.state == "stopped"
        assert listener_summary(stopped, stopped.updated + 600) == ("stopped 600 s ago (a clean stop)", "off")


# --- legacy subscriptions ---------------------------------------------------------------------------


async def test_envelopes_reach_legacy_subscriptions_as_v3_messages(sqlite_url: str) -> None:
    """docs/legacy.md#the-v3-message: an xmtpd group message and welcome reach legacy subscriptions
    of their topic strings, built as the v3 node would have sent them, keyed by their origin."""
    async with Receiver() as operator:
        delivery = operator.endpoint(signed=False)
        overrides = {"legacy_api_enabled": True, "legacy_http_delivery_url": delivery.url}
        async with harness(sqlite_url, **overrides) as h:
            g, w = group_topic(), welcome_topic()
            strings = [f"/xmtp/mls/1/{letter}-{t[1:].hex()}/proto" for letter, t in (("g", g), ("w", w))]
            rules = h.runtime.legacy_rules
            async with h.runtime.sessions() as session, session.begin():
                mechanism = Mechanism(MechanismKind.CUSTOM, "operator-token")
                await legacy_service.register(session, rules, RegisterInstallation("legacy", mechanism))
                specs = legacy_service.topics_only(strings)
                await legacy_service.subscribe(
                    session, rules, Subscribe("legacy", specs, with_metadata=False)
                )
            await h.connected()
            h.fake.publish([group_message(100, 7, g, should_push=True), welcome_message(100, 8, w)])
            await h.until(lambda: len(delivery.requests) == 2, "both legacy deliveries")
            by_topic = {r.payload["message"]["content_topic"]: r.payload for r in delivery.requests}
            group = mls_pb2.GroupMessage.FromString(
                base64.b64decode(by_topic[strings[0]]["message"]["message"])
            )
            assert (group.v1.id, group.v1.group_id, group.v1.should_push) == (7, g[1:], True)
            assert by_topic[strings[0]]["idempotency_key"] == "100:7"
            assert by_topic[strings[1]]["message_context"] == {"message_type": "v3-welcome"}
            welcome = mls_pb2.WelcomeMessage.FromString(
                base64.b64decode(by_topic[strings[1]]["message"]["message"])
            )
            assert (welcome.v1.id, welcome.v1.installation_key) == (8, w[1:])
