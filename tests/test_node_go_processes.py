"""`xmtp-push listen` on a node-go node, as processes: two listeners push each envelope once and a
killed one loses nothing (docs/legacy.md#from-envelope-to-push); a listener is ready only while its
SubscribeAll stream is open, and says when the node is unreachable and when it answers again
(docs/operations.md#when-something-is-down); `listen` reads xmtpd and node-go side by side and needs one
of them; `dev` reads node-go too when its address is set.

The fake node-go node, the webhook receiver standing for the operator's HTTP delivery and the API (for
the legacy registrations) run in this process; the listeners and the worker are real child processes
of the console script, on PostgreSQL and the Redis test DB or the test Redis Cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from app.legacy.jobs import LEGACY_ENVELOPES, legacy_delivery_stream
from app.proto.notifications.v1 import service_pb2 as lpb
from fakes.fake_node_go import FakeNodeGo, group_message, welcome_message
from fakes.fake_xmtpd import FakeXmtpd
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.legacy import legacy_ok, register_request
from tests.support.listeners import stack_env
from tests.support.ops import child_env
from tests.support.pipeline import Pipeline, Stack, running_pipeline, wait_until
from tests.support.process import Child, child, events, wait_answering

pytestmark = pytest.mark.slow

redis_url = pipeline_support.redis_url
redis_stack = pipeline_support.redis_stack
redis_postgresql_stack = pipeline_support.redis_postgresql_stack

INSTALLATIONS = 12
GROUPS = 6
STEPS = 24
STEP_SECONDS = 0.15
KILL_AT_STEP = 10
WAIT = 60.0
UNREACHABLE = "XMTP_PUSH_NODE_GO_ADDRESS: the node is unreachable (UNAVAILABLE); retrying with backoff"
ANSWERS_AGAIN = "XMTP_PUSH_NODE_GO_ADDRESS: the node answers again"
SERVING = re.compile(r"serving http=\S*:(\d+) grpc=")


def key_of(envelope: object) -> str:
    """The idempotency key of docs/legacy.md, computed here: hex(SHA-1(topic ‖ message))."""
    topic, message = envelope.content_topic, envelope.message  # type: ignore[attr-defined]
    return hashlib.sha1(topic.encode() + message, usedforsecurity=False).hexdigest()


async def subscribe_installations(
    pipe: Pipeline, groups: list[bytes], welcome_key: bytes
) -> dict[str, set[str]]:
    """INSTALLATIONS devices over the legacy API, the i-th on groups i and i+1 (round the list), the
    first also on a welcome topic: each one's topics."""
    topics: dict[str, set[str]] = {}
    for i in range(INSTALLATIONS):
        installation = f"device-{i}"
        await legacy_ok(pipe.http, register_request(installation, custom_token=f"token-{i}"))
        mine = {group_message(groups[(i + j) % GROUPS], 0).content_topic for j in (0, 1)}
        if i == 0:
            mine.add(welcome_message(welcome_key, 0).content_topic)
        await legacy_ok(pipe.http, lpb.SubscribeRequest(installation_id=installation, topics=sorted(mine)))
        topics[installation] = mine
    return topics


def pushed(receiver_requests: list[object]) -> dict[str, Counter[str]]:
    """The idempotency keys each installation was pushed, counted."""
    found: dict[str, Counter[str]] = {}
    for request in receiver_requests:
        payload = request.payload  # type: ignore[attr-defined]
        found.setdefault(payload["installation"]["id"], Counter())[payload["idempotency_key"]] += 1
    return found


async def readiness(process: Child) -> tuple[int, dict[str, str]]:
    port = await process.probe_port()
    answer = await wait_answering(f"http://127.0.0.1:{port}/readyz")
    return answer.status_code, answer.json()["checks"]


async def legacy_work_left(pipe: Pipeline) -> int:
    queue = pipe.runtime.queue
    assert queue is not None
    streams = (LEGACY_ENVELOPES, legacy_delivery_stream("http"))
    return sum([await queue.depth(stream) for stream in streams]) + await queue.delayed_count()


async def test_two_listeners_push_each_envelope_once_and_a_killed_one_loses_nothing(
    redis_stack: Stack, receiver: Receiver, node_go: FakeNodeGo
) -> None:
    """On a single Redis and on a Redis Cluster."""
    delivery = receiver.endpoint(signed=False)
    legacy = {"legacy_api_enabled": "true", "legacy_http_delivery_url": delivery.url}
    async with (
        running_pipeline(redis_stack, workers=False, **legacy) as pipe,
        AsyncExitStack() as processes,
    ):
        groups = [secrets.token_bytes(16) for _ in range(GROUPS)]
        welcome_key = secrets.token_bytes(32)
        topics = await subscribe_installations(pipe, groups, welcome_key)
        env = stack_env(redis_stack, **legacy, node_go_address=node_go.address, node_go_tls="false")
        worker = await processes.enter_async_context(child("worker", ["worker"], env))
        victim, survivor = [
            await processes.enter_async_context(child(name, ["listen"], env))
            for name in ("listen-a", "listen-b")
        ]
        await node_go.wait_for(lambda: node_go.open_streams == 2, WAIT, "both listeners' streams")
        for listener in (victim, survivor):
            assert await readiness(listener) == (200, {"redis": "ok", "node_go": "ok"})

        published = []
        for step in range(STEPS):
            if step == KILL_AT_STEP:
                victim.process.kill()
                await victim.process.wait()
                await node_go.wait_for(lambda: node_go.open_streams == 1, WAIT, "the killed stream to close")
            envelopes = [group_message(group, step + 1) for group in groups]
            if step % 4 == 0:
                envelopes.append(welcome_message(welcome_key, step + 1))
            assert node_go.publish(envelopes) == (2 if step < KILL_AT_STEP else 1)
            published += envelopes
            await asyncio.sleep(STEP_SECONDS)

        want = {
            installation: Counter(key_of(e) for e in published if e.content_topic in mine)
            for installation, mine in topics.items()
        }
        total = sum(sum(keys.values()) for keys in want.values())

        def arrived() -> bool:
            return len(delivery.requests) >= total or survivor.process.returncode is not None

        await wait_until(arrived, WAIT, "every push")
        assert survivor.process.returncode is None, survivor.output()
        for _ in range(10):  # nothing more comes: the queue is empty and stays so
            assert await legacy_work_left(pipe) == 0
            await asyncio.sleep(0.1)
        assert pushed(delivery.requests) == want
        assert victim.process.returncode == -9
        assert await survivor.stop() == 0, survivor.output()
        assert await worker.stop() == 0, worker.output()


async def test_a_listener_is_ready_only_while_its_node_go_stream_is_open(
    redis_postgresql_stack: Stack, node_go: FakeNodeGo
) -> None:
    await node_go.go_away()
    env = stack_env(redis_postgresql_stack, node_go_address=node_go.address, node_go_tls="false")
    async with child("listen", ["listen"], env) as listener:
        await listener.line(re.compile(re.escape(UNREACHABLE)))
        assert await readiness(listener) == (503, {"redis": "ok", "node_go": "unavailable"})
        await node_go.come_back()
        await node_go.wait_for(lambda: node_go.open_streams == 1, WAIT, "the listener's stream")
        await listener.line(re.compile(re.escape(ANSWERS_AGAIN)))
        assert await readiness(listener) == (200, {"redis": "ok", "node_go": "ok"})
        port = await listener.probe_port()
        async with httpx.AsyncClient() as client:
            scraped = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        assert "xmtp_push_node_go_listener_state 2.0" in scraped
        assert 'xmtp_push_dependency_up{dependency="node_go"} 1.0' in scraped
        assert await listener.stop() == 0, listener.output()
    said = [str(event.get("event")) for event in events(listener)]
    assert said.count(UNREACHABLE) == 1 and said.count(ANSWERS_AGAIN) == 1, said
    assert node_go.address not in json.dumps(events(listener))


async def test_listen_reads_xmtpd_and_node_go_side_by_side_and_needs_one_of_them(
    redis_postgresql_stack: Stack, node_go: FakeNodeGo
) -> None:
    async with FakeXmtpd(keepalive_seconds=0.25) as xmtpd:
        addresses = {"xmtpd_address": xmtpd.address, "xmtpd_tls": "false"}
        env = stack_env(
            redis_postgresql_stack, **addresses, node_go_address=node_go.address, node_go_tls="false"
        )
        async with child("listen", ["listen"], env) as listener:
            await node_go.wait_for(lambda: node_go.open_streams == 1, WAIT, "the node-go stream")
            await xmtpd.wait_for(lambda: xmtpd.open_streams == 1, WAIT, "the firehose")
            status, checks = await readiness(listener)
            assert (status, checks["node_go"], checks["firehose"]) == (200, "ok", "ok"), checks
            assert await listener.stop() == 0, listener.output()
    async with child("listen", ["listen"], stack_env(redis_postgresql_stack)) as neither:
        assert await neither.process.wait() == 2
    assert (
        "XMTP_PUSH_XMTPD_ADDRESS or XMTP_PUSH_NODE_GO_ADDRESS: one of them is required by `listen`"
        in neither.output()
    )


async def test_dev_reads_node_go_when_its_address_is_set(
    node_go: FakeNodeGo, receiver: Receiver, tmp_path: Path
) -> None:
    delivery = receiver.endpoint(signed=False)
    env = child_env(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'dev.db'}",
        http_port="0",
        grpc_port="0",
        legacy_api_enabled="true",
        legacy_http_delivery_url=delivery.url,
        node_go_address=node_go.address,
        node_go_tls="false",
    )
    async with child("dev", ["dev"], env) as dev:
        port = int((await dev.line(SERVING)).group(1))
        await node_go.wait_for(lambda: node_go.open_streams == 1, WAIT, "dev's node-go stream")
        envelope = group_message(secrets.token_bytes(16), 1)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            await legacy_ok(http, register_request("device", custom_token="token"))
            subscribe = lpb.SubscribeRequest(installation_id="device", topics=[envelope.content_topic])
            await legacy_ok(http, subscribe)
        node_go.publish([envelope])
        await wait_until(lambda: len(delivery.requests) == 1, WAIT, "the push")
        assert delivery.requests[0].payload["idempotency_key"] == key_of(envelope)
        assert await dev.stop() == 0, dev.output()
