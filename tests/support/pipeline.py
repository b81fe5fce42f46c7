"""Helpers for the end-to-end pipeline tests: Redis, the stacks, a running pipeline.

Nothing here replaces a part of the product: the API, the queue (in-process or
real Redis), the database (SQLite or PostgreSQL), the fan-out and delivery
workers and the webhook client all run for real; the receiver (the `receiver`
fixture, tests/support/fakes.py) is a real HTTP server that checks every request
with the `standardwebhooks` library.

Fixtures are plain functions here; test modules import them by name.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import os
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import func, select

from app.proto.xmtp.backend.v1 import envelope_pb2, notification_pb2, notification_pb2_grpc
from app.queue.base import ENVELOPES, delivery_stream
from app.recipients.models import Recipient, Subscription
from app.runtime import Runtime, open_runtime
from fakes.webhook_receiver import Endpoint, Receiver
from tests.support import clear_tables, host_lock, make_settings, took_host_lock
from workers.server import running_api

REDIS_TEST_URL = os.environ.get("XMTP_PUSH_TEST_REDIS", "redis://127.0.0.1:6379/9")
INGEST_TOKEN = "t"

# From docs/hints.md, written out again here rather than imported from app/.
EPOCH_SECONDS = 2_592_000
EPOCH_NS = EPOCH_SECONDS * 1_000_000_000
HKDF_SALT = b"libXMTP HKDF salt!"
HMAC_KEY_LENGTH = 42

# --- Redis ------------------------------------------------------------------


@asynccontextmanager
async def exclusive_redis_db(url: str, timeout: float = 120.0) -> AsyncIterator[None]:
    """Hold a host-wide lock on the test DB, so test runs started side by side do not flush
    each other's queues; waits for a run that holds it."""
    descriptor = host_lock(url)
    try:
        deadline = time.monotonic() + timeout
        while not took_host_lock(descriptor):
            if time.monotonic() > deadline:
                raise AssertionError(f"another test run held the Redis test DB for {timeout} s")
            await asyncio.sleep(0.05)
        yield
    finally:
        os.close(descriptor)  # releases the lock


@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    """The dedicated test Redis DB, flushed before (and after) the test."""
    async with exclusive_redis_db(REDIS_TEST_URL):
        client = Redis.from_url(REDIS_TEST_URL)
        try:
            await client.flushdb()
            yield REDIS_TEST_URL
            await client.flushdb()
        finally:
            await client.aclose()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


# --- where the pipeline runs --------------------------------------------------


@dataclass(frozen=True)
class Stack:
    queue: str  # memory | redis | cluster (the test Redis Cluster, tests/support/redis_cluster.py)
    database: str  # sqlite | postgresql
    database_url: str
    redis_url: str | None


ALL_STACKS = ("memory-sqlite", "memory-postgresql", "redis-sqlite", "redis-postgresql", "cluster-postgresql")
TWO_STACKS = ("memory-sqlite", "redis-postgresql", "cluster-postgresql")
REDIS_STACKS = ("redis-postgresql", "cluster-postgresql")


def stack_for(request: pytest.FixtureRequest, name: str) -> Stack:
    queue, database = name.split("-")
    database_url = str(request.getfixturevalue(f"{database}_url"))
    redis = None
    if queue == "redis":
        redis = str(request.getfixturevalue("redis_url"))
    elif queue == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        redis = cluster.url
    return Stack(queue, database, database_url, redis)


@pytest.fixture
def redis_postgresql_stack(postgresql_url: str, redis_url: str) -> Stack:
    return Stack("redis", "postgresql", postgresql_url, redis_url)


@pytest.fixture(params=REDIS_STACKS)
def redis_stack(request: pytest.FixtureRequest) -> Stack:
    """Redis on PostgreSQL: the single Redis's test DB, and the test Redis Cluster (emptied)."""
    return stack_for(request, request.param)


@pytest.fixture
def cluster_postgresql_stack(request: pytest.FixtureRequest) -> Stack:
    """The test Redis Cluster (emptied) on PostgreSQL."""
    return stack_for(request, "cluster-postgresql")


@asynccontextmanager
async def redis_of(stack: Stack) -> AsyncIterator[Redis | RedisCluster]:
    """A client of the stack's Redis, to look at the queue's keys: on a cluster, each call goes to
    the primary holding its key."""
    assert stack.redis_url is not None
    client: Redis | RedisCluster
    if stack.queue == "cluster":
        client = RedisCluster.from_url(stack.redis_url)
    else:
        client = Redis.from_url(stack.redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(params=ALL_STACKS)
def stack(request: pytest.FixtureRequest) -> Stack:
    """In-process queue or Redis, SQLite or PostgreSQL: every combination; and a Redis Cluster on
    PostgreSQL."""
    return stack_for(request, request.param)


@pytest.fixture(params=TWO_STACKS)
def some_stack(request: pytest.FixtureRequest) -> Stack:
    """The two ends: in-process queue on SQLite, Redis on PostgreSQL; and a Redis Cluster on PostgreSQL."""
    return stack_for(request, request.param)


# --- waiting --------------------------------------------------------------------


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until predicate() holds; returns the seconds it took. Fails the test on timeout."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


# --- sender suppression keys (the client's derivation, docs/hints.md) --------


def hkdf_sha256_by_hand(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF with SHA-256, extract then expand."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in itertools.count(1):
        if len(okm) >= length:
            break
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:
        return hkdf_sha256_by_hand(ikm, salt=salt, info=info, length=length)
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def epoch_of(server_ns: int) -> int:
    return server_ns // EPOCH_NS


def current_epoch() -> int:
    return epoch_of(time.time_ns())


def ns_in_epoch(epoch: int, offset_seconds: int = 3_600) -> int:
    """A server timestamp inside the given epoch."""
    return epoch * EPOCH_NS + offset_seconds * 1_000_000_000


def group_id_of(topic: bytes) -> bytes:
    return topic[1:]


def hmac_key(root_key: bytes, group_id: bytes, epoch: int) -> bytes:
    info = group_id + epoch.to_bytes(8, "little", signed=True)
    return hkdf_sha256(root_key + group_id, salt=HKDF_SALT, info=info, length=HMAC_KEY_LENGTH)


def key_window(root_key: bytes, group_id: bytes, current: int) -> tuple[int, list[bytes]]:
    """What a client uploads: keys for current-1, current, current+1, based at current-1."""
    return current - 1, [hmac_key(root_key, group_id, epoch) for epoch in (current - 1, current, current + 1)]


def sender_hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


# --- values -----------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def group_topic() -> bytes:
    return b"\x00" + secrets.token_bytes(16)


def welcome_topic() -> bytes:
    return b"\x01" + secrets.token_bytes(32)


def envelope(
    topic: bytes,
    sequence_id: int,
    *,
    kind: str = "group_message",
    server_ns: int | None = None,
    should_push: bool | None = True,
    commit: bool | None = None,
    hmac_value: bytes | None = None,
    data: bytes | None = None,
) -> dict[str, Any]:
    """One envelope of a JSON ingest batch."""
    item: dict[str, Any] = {
        "topic": b64(topic),
        "sequence_id": str(sequence_id),
        "server_ns": time.time_ns() if server_ns is None else server_ns,
        "kind": kind,
    }
    if should_push is not None:
        item["should_push"] = should_push
    if commit is not None:
        item["is_commit_or_proposal"] = commit
    if hmac_value is not None:
        item["sender_hmac"] = b64(hmac_value)
    if data is not None:
        item["data"] = b64(data)
    return item


def server_envelope(
    topic: bytes,
    sequence_id: int,
    *,
    server_ns: int | None = None,
    payload: str = "group_message",
    data: bytes = b"",
    hmac_value: bytes = b"",
    should_push: bool = True,
    commit: bool = False,
) -> bytes:
    """One serialized xmtp.backend.v1.ServerEnvelope."""
    meta = envelope_pb2.EnvelopeMeta(
        cursor=envelope_pb2.Cursor(sequence_id=sequence_id),
        server_ns=time.time_ns() if server_ns is None else server_ns,
        message_hash=envelope_pb2.MessageHash(sha256=hashlib.sha256(data).digest()),
        topic=envelope_pb2.Topic(topic=topic),
        expiry_ns=time.time_ns() + 86_400 * 10**9,
        is_commit_or_proposal=commit,
    )
    client = envelope_pb2.ClientEnvelope()
    if payload == "group_message":
        client.group_message.CopyFrom(
            envelope_pb2.GroupMessage(data=data, sender_hmac=hmac_value, should_push=should_push)
        )
    elif payload == "welcome_message":
        client.welcome_message.SetInParent()
    elif payload == "key_package":
        client.key_package.SetInParent()
    else:
        raise AssertionError(f"unknown payload {payload}")
    return envelope_pb2.ServerEnvelope(meta=meta, envelope=client).SerializeToString()


def expected_body(topic: bytes, sequence_id: int, recipient_id: bytes) -> bytes:
    """The exact webhook body of docs/hints.md, written out independently of app/."""
    return (
        b'{"topic":"'
        + b64(topic).encode()
        + b'","sequence_id":"'
        + str(sequence_id).encode()
        + b'","recipient_id":"'
        + recipient_id.hex().encode()
        + b'"}'
    )


# --- metrics -----------------------------------------------------------------------


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# --- the running pipeline ----------------------------------------------------------


def hints_of(receiver: Receiver, member: Member) -> Counter[tuple[bytes, int]]:
    """The (topic, sequence_id) hints `member`'s endpoint received, counted."""
    return Counter(
        (topic, sequence) for topic, sequence, _ in receiver.endpoints[member.endpoint.path].hints()
    )


@dataclass
class Member:
    """A registered webhook recipient."""

    rid: bytes
    secret: bytes
    endpoint: Endpoint


@dataclass
class Pipeline:
    runtime: Runtime
    stub: notification_pb2_grpc.NotificationServiceStub
    http: httpx.AsyncClient
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _workers: asyncio.Task[None] | None = None

    # workers

    def start_workers(self) -> None:
        from workers.runner import run_workers

        assert self._workers is None
        self._stop = asyncio.Event()
        self._workers = asyncio.create_task(run_workers(self.runtime, self._stop))

    async def stop_workers(self) -> None:
        task, self._workers = self._workers, None
        if task is None:
            return
        self._stop.set()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise AssertionError("the workers stopped with an error") from task.exception()
        # The read loops block up to a second between checks of the stop event; a test need not wait.
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if not done:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def check_workers(self) -> None:
        task = self._workers
        if task is not None and task.done():
            raise AssertionError("the workers stopped") from (None if task.cancelled() else task.exception())

    async def settled(self, receiver: Receiver | None = None, timeout: float = 15.0) -> None:
        """Wait until the queue holds nothing (waiting, in flight or delayed) on several looks in a row."""
        queue = self.runtime.queue
        assert queue is not None
        streams = (ENVELOPES, delivery_stream("http"))
        started, quiet = time.monotonic(), 0
        while quiet < 4:
            self.check_workers()
            depths = [await queue.depth(s) for s in streams] + [await queue.delayed_count()]
            busy = any(depths) or (receiver is not None and receiver.active() > 0)
            quiet = 0 if busy else quiet + 1
            if time.monotonic() - started > timeout:
                raise AssertionError(f"pipeline did not settle within {timeout} s: depths {depths}")
            await asyncio.sleep(0.04)

    # notification API, over real gRPC

    async def register(
        self, endpoint: Endpoint, member: Member | None = None, key: bytes | None = None
    ) -> Member:
        """Register (or re-register `member`) with webhook delivery to `endpoint`."""
        if member is None:
            member = Member(secrets.token_bytes(32), secrets.token_bytes(32), endpoint)
        member.endpoint = endpoint
        await self.stub.Register(
            notification_pb2.RegisterRequest(
                recipient_id=member.rid,
                recipient_secret=member.secret,
                http=notification_pb2.HttpDelivery(url=endpoint.url, signing_key=key or endpoint.key),
            ),
            timeout=10,
        )
        return member

    async def subscribe(
        self,
        member: Member,
        topic: bytes,
        *,
        base: int = 0,
        keys: Sequence[bytes] = (),
        commits: bool = False,
    ) -> None:
        await self.stub.UpdateSubscriptions(
            notification_pb2.UpdateSubscriptionsRequest(
                recipient_id=member.rid,
                recipient_secret=member.secret,
                adds=[
                    notification_pb2.Subscription(
                        topic=topic, hmac_epoch_base=base, hmac_keys=list(keys), include_commits=commits
                    )
                ],
            ),
            timeout=10,
        )

    async def member(self, endpoint: Endpoint, *topics: bytes, commits: bool = False) -> Member:
        registered = await self.register(endpoint)
        for topic in topics:
            await self.subscribe(registered, topic, commits=commits)
        return registered

    async def members_on_neighbours(
        self, endpoint: Callable[[], Endpoint], topics: Sequence[bytes], count: int
    ) -> dict[bytes, list[bytes]]:
        """`count` members, each on an endpoint of its own, the i-th subscribed to topics i and i+1
        (round the list): each topic's subscribers' ids."""
        subscribers: dict[bytes, list[bytes]] = {topic: [] for topic in topics}
        for i in range(count):
            member = await self.register(endpoint())
            for topic in (topics[i % len(topics)], topics[(i + 1) % len(topics)]):
                await self.subscribe(member, topic)
                subscribers[topic].append(member.rid)
        return subscribers

    # ingest

    async def ingest(
        self, envelopes: list[dict[str, Any]], token: str | None = INGEST_TOKEN
    ) -> httpx.Response:
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return await self.http.post(
            "/v1/envelopes", content=json.dumps({"envelopes": envelopes}), headers=headers
        )

    async def ingest_ok(self, envelopes: list[dict[str, Any]]) -> dict[str, Any]:
        """Ingest, expecting every envelope accepted; returns the 202 answer."""
        response = await self.ingest(envelopes)
        assert response.status_code == 202, response.text
        answer: dict[str, Any] = response.json()
        assert answer["accepted"] == len(envelopes), answer
        return answer

    async def ingest_proto(self, body: bytes, token: str = INGEST_TOKEN) -> httpx.Response:
        headers = {"content-type": "application/x-protobuf", "authorization": f"Bearer {token}"}
        return await self.http.post("/v1/envelopes", content=body, headers=headers)

    # stored state

    async def recipient(self, rid: bytes) -> Recipient | None:
        async with self.runtime.sessions() as session:
            return await session.get(Recipient, rid)

    async def subscription_count(self, rid: bytes) -> int:
        async with self.runtime.sessions() as session:
            query = select(func.count()).select_from(Subscription).where(Subscription.recipient_id == rid)
            return int((await session.execute(query)).scalar_one())

    # metrics

    async def metrics_text(self) -> str:
        response = await self.http.get("/metrics")
        assert response.status_code == 200
        return response.text


def pipeline_settings(stack: Stack, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "redis_url": stack.redis_url,
        "ingest_token": INGEST_TOKEN,
        "retry_base_seconds": 0.05,
        "max_attempts": 3,
        # Only the webhook channel: the APNs and FCM workers have nothing to do here.
        "apns_key": None,
        "fcm_service_account": None,
    }
    values.update(overrides)
    return make_settings(stack.database_url, **values)


@asynccontextmanager
async def running_pipeline(
    stack: Stack, *, workers: bool = True, **overrides: Any
) -> AsyncIterator[Pipeline]:
    """API (HTTP + gRPC) and, unless told otherwise, the workers, in this event loop."""
    settings = pipeline_settings(stack, **overrides)
    async with open_runtime(settings, in_process_queue=stack.redis_url is None) as runtime:
        await clear_tables(runtime)
        async with running_api(runtime) as servers:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{servers.grpc_port}")
            base_url = f"http://127.0.0.1:{servers.http_port}"
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                pipe = Pipeline(runtime, notification_pb2_grpc.NotificationServiceStub(channel), http)
                try:
                    if workers:
                        pipe.start_workers()
                    yield pipe
                finally:
                    await pipe.stop_workers()
                    await channel.close()
