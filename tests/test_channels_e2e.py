"""APNs, FCM and webhook hints through the whole pipeline, in one process.

The real runtime (PostgreSQL, Redis DB 7), the HTTP and gRPC APIs and `workers.runner.run_workers`
run as in production; recipients register over gRPC and envelopes come in over `POST /v1/envelopes`.
Only the remote ends are stand-ins: the local APNs (fakes/fake_apns.py), the local FCM and OAuth
token endpoint (fakes/fake_fcm.py) and a webhook receiver that checks signatures
(fakes/webhook_receiver.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.queue.base import ENVELOPES, delivery_stream
from app.recipients.models import Recipient
from app.runtime import Runtime, open_runtime
from fakes.fake_apns import FakeApns
from fakes.fake_apns import Reply as ApnsReply
from fakes.fake_fcm import FakeFcm
from fakes.fake_fcm import Reply as FcmReply
from fakes.keys import service_account
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Receiver
from tests.support import clear_tables, eventually, make_settings
from tests.support.pipeline import exclusive_redis_db
from workers.server import running_api

# Every test here reaches these services itself.
pytestmark = [pytest.mark.redis, pytest.mark.postgres]

REDIS_URL = "redis://127.0.0.1:6379/7"
INGEST_TOKEN = "t"
STREAMS = (ENVELOPES, *(delivery_stream(label) for label in ("apns", "fcm", "http")))
_topics = itertools.count(1)


def new_topic() -> bytes:
    return b"\x00" + (next(_topics) + 10_000 * secrets.randbelow(1000)).to_bytes(16, "big")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --------------------------------------------------------------------------- remote ends


# --------------------------------------------------------------------------- the pipeline


@dataclass
class Member:
    rid: bytes
    secret: bytes


@dataclass
class Pipeline:
    runtime: Runtime
    stub: notification_pb2_grpc.NotificationServiceStub
    http: httpx.AsyncClient
    workers: asyncio.Task[None]

    async def register(self, member: Member | None = None, **delivery: Any) -> Member:
        member = member or Member(secrets.token_bytes(32), secrets.token_bytes(32))
        await self.stub.Register(
            pb.RegisterRequest(recipient_id=member.rid, recipient_secret=member.secret, **delivery),
            timeout=10,
        )
        return member

    async def apns(self, token: str, *topics: bytes) -> Member:
        return await self.subscribed(await self.register(apns=pb.ApnsDelivery(token=token)), topics)

    async def fcm(self, token: str, *topics: bytes) -> Member:
        return await self.subscribed(await self.register(fcm=pb.FcmDelivery(token=token)), topics)

    async def webhook(self, receiver: Receiver, *topics: bytes) -> Member:
        endpoint = receiver.endpoint()
        member = await self.register(http=pb.HttpDelivery(url=endpoint.url, signing_key=endpoint.key))
        return await self.subscribed(member, topics)

    async def subscribed(self, member: Member, topics: tuple[bytes, ...]) -> Member:
        await self.stub.UpdateSubscriptions(
            pb.UpdateSubscriptionsRequest(
                recipient_id=member.rid,
                recipient_secret=member.secret,
                adds=[pb.Subscription(topic=topic) for topic in topics],
            ),
            timeout=10,
        )
        return member

    async def ingest(self, topic: bytes, sequence_id: int) -> None:
        envelope = {
            "topic": b64(topic),
            "sequence_id": str(sequence_id),
            "server_ns": time.time_ns(),
            "kind": "group_message",
            "should_push": True,
        }
        response = await self.http.post(
            "/v1/envelopes",
            content=json.dumps({"envelopes": [envelope]}),
            headers={"authorization": f"Bearer {INGEST_TOKEN}", "content-type": "application/json"},
        )
        assert response.status_code == 202, response.text

    async def stored(self, member: Member) -> Recipient | None:
        async with self.runtime.sessions() as session:
            result = await session.execute(select(Recipient).where(Recipient.id == member.rid))
            return result.scalar_one_or_none()

    async def settled(self, timeout: float = 10.0) -> None:
        """Nothing waiting, in flight or delayed, on several looks in a row."""
        queue = self.runtime.queue
        assert queue is not None
        deadline, quiet = time.monotonic() + timeout, 0
        while quiet < 4:
            self.check_workers()
            depths = [await queue.depth(s) for s in STREAMS] + [await queue.delayed_count()]
            quiet = 0 if any(depths) else quiet + 1
            if time.monotonic() > deadline:
                raise AssertionError(f"the pipeline did not settle: depths {depths}")
            await asyncio.sleep(0.03)

    def check_workers(self) -> None:
        if self.workers.done():
            raise AssertionError("the workers stopped") from (
                None if self.workers.cancelled() else self.workers.exception()
            )


@pytest.fixture
async def start(
    postgresql_url: str, apns_server: FakeApns, fcm_server: FakeFcm
) -> AsyncIterator[Callable[..., contextlib.AbstractAsyncContextManager[Pipeline]]]:
    apns_server.reset()
    fcm_server.reset()
    async with exclusive_redis_db(REDIS_URL):  # test runs started side by side take turns
        redis = Redis.from_url(REDIS_URL)
        try:
            await redis.flushdb()
        finally:
            await redis.aclose()
        yield _pipeline(postgresql_url, apns_server, fcm_server)
    assert apns_server.failures == []  # every request we sent was well-formed HTTP/2


def _pipeline(
    postgresql_url: str, apns_server: FakeApns, fcm_server: FakeFcm
) -> Callable[..., contextlib.AbstractAsyncContextManager[Pipeline]]:
    @contextlib.asynccontextmanager
    async def pipeline(**overrides: Any) -> AsyncIterator[Pipeline]:
        values: dict[str, Any] = {
            "redis_url": REDIS_URL,
            "ingest_token": INGEST_TOKEN,
            "apns_endpoint": apns_server.endpoint,
            "apns_ca_file": apns_server.tls.ca_file,
            "fcm_service_account": service_account(token_uri=fcm_server.token_uri),
            "fcm_endpoint": fcm_server.endpoint,
            "retry_base_seconds": 0.05,
        }
        values.update(overrides)
        settings = make_settings(postgresql_url, **values)
        async with open_runtime(settings) as runtime, running_api(runtime) as servers:
            await clear_tables(runtime)
            from workers.runner import run_workers

            stop = asyncio.Event()
            workers = asyncio.create_task(run_workers(runtime, stop))
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{servers.grpc_port}")
            http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{servers.http_port}", timeout=10)
            try:
                yield Pipeline(runtime, notification_pb2_grpc.NotificationServiceStub(channel), http, workers)
            finally:
                stop.set()
                done, _ = await asyncio.wait({workers}, timeout=0.1)  # reads block up to 1 s
                if not done:
                    workers.cancel()
                await asyncio.gather(workers, return_exceptions=True)
                await http.aclose()
                await channel.close()

    return pipeline


# --------------------------------------------------------------------------- tests


async def test_hints_arrive_on_every_channel_with_the_exact_payloads(
    start: Any, receiver: Receiver, apns_server: FakeApns, fcm_server: FakeFcm
) -> None:
    async with start() as pipe:
        topic = new_topic()
        await pipe.apns("ok.e2e", topic)
        await pipe.fcm("ok.e2e", topic)
        hook_member = await pipe.webhook(receiver, topic)

        await pipe.ingest(topic, 9_007_199_254_740_993)
        await eventually(
            lambda: apns_server.count == 1 and fcm_server.count == 1 and len(receiver.all_requests()) == 1
        )
        await pipe.settled()

    [apns] = apns_server.requests
    assert apns.path == "/3/device/ok.e2e"
    assert apns.header("apns-push-type") == "background" and apns.header("apns-priority") == "5"
    assert apns.header("apns-topic") == "org.example.app" and apns.header("apns-collapse-id") == b64(topic)
    assert apns.json() == {
        "aps": {"content-available": 1},
        "topic": b64(topic),
        "sequence_id": "9007199254740993",
    }

    [fcm] = fcm_server.requests
    assert fcm.path == "/v1/projects/test-project/messages:send"
    assert fcm.headers["authorization"] == "Bearer test-token"
    assert fcm.json() == {
        "message": {
            "token": "ok.e2e",
            "data": {"topic": b64(topic), "sequence_id": "9007199254740993"},
            "android": {"priority": "HIGH"},
            "apns": {
                "headers": {"apns-priority": "5", "apns-push-type": "background"},
                "payload": {"aps": {"content-available": 1}},
            },
        }
    }

    [hook] = receiver.all_requests()
    recipient = hook_member.rid.hex()
    expected = f'{{"topic":"{b64(topic)}","sequence_id":"9007199254740993","recipient_id":"{recipient}"}}'
    assert hook.body == expected.encode()
    assert receiver.failures == []


async def test_dead_tokens_delete_only_their_recipients(
    start: Any, apns_server: FakeApns, fcm_server: FakeFcm
) -> None:
    async with start() as pipe:
        topic = new_topic()
        members = {
            "apns-gone": await pipe.apns("gone.1", topic),  # 410 Unregistered
            "apns-expired": await pipe.apns("expiredtoken.1", topic),  # 410 ExpiredToken
            "apns-mismatch": await pipe.apns("topic.1", topic),  # 400 DeviceTokenNotForTopic
            "apns-rejected": await pipe.apns("forbidden.1", topic),  # 403 other reason
            "apns-ok": await pipe.apns("ok.1", topic),
            "fcm-gone": await pipe.fcm("gone.1", topic),  # UNREGISTERED
            "fcm-mismatch": await pipe.fcm("mismatch.1", topic),  # SENDER_ID_MISMATCH
            "fcm-rejected": await pipe.fcm("invalid.1", topic),  # INVALID_ARGUMENT
            "fcm-ok": await pipe.fcm("ok.1", topic),
        }
        await pipe.ingest(topic, 1)
        await eventually(lambda: apns_server.count == 5 and fcm_server.count == 4)
        await pipe.settled()

        kept = {name for name, member in members.items() if await pipe.stored(member) is not None}
    assert kept == {"apns-mismatch", "apns-rejected", "apns-ok", "fcm-mismatch", "fcm-rejected", "fcm-ok"}
    # Final outcomes are not retried.
    assert apns_server.count == 5 and fcm_server.count == 4


@pytest.mark.parametrize("channel", ["apns", "fcm"])
async def test_a_re_registration_during_the_attempt_keeps_the_recipient(
    start: Any, apns_server: FakeApns, fcm_server: FakeFcm, channel: str
) -> None:
    async with start() as pipe:
        topic = new_topic()
        if channel == "apns":
            apns_server.script("gone.held", ApnsReply(410, "Unregistered", held=True))
            member = await pipe.apns("gone.held", topic)
            fake: FakeApns | FakeFcm = apns_server
        else:
            fcm_server.script("gone.held", FcmReply(404, "NOT_FOUND", "UNREGISTERED", held=True))
            member = await pipe.fcm("gone.held", topic)
            fake = fcm_server

        await pipe.ingest(topic, 1)
        await fake.wait_for(1)  # the attempt is out, its answer held back
        delivery = pb.ApnsDelivery(token="ok.new") if channel == "apns" else pb.FcmDelivery(token="ok.new")
        await pipe.register(member, **{channel: delivery})  # a new token for the same recipient
        fake.release()  # now the old token is reported dead
        await pipe.settled()

        stored = await pipe.stored(member)
        assert stored is not None and stored.target == "ok.new"
        await pipe.ingest(topic, 2)  # and the new token gets the next hint
        await fake.wait_for(2)
        await pipe.settled()
    new_token = apns_server.requests[-1].token if channel == "apns" else fcm_server.requests[-1].token
    assert new_token == "ok.new"


async def test_fcm_quota_pauses_fcm_only(
    start: Any, receiver: Receiver, apns_server: FakeApns, fcm_server: FakeFcm
) -> None:
    async with start() as pipe:
        queue = pipe.runtime.queue
        assert queue is not None
        fcm_server.script("quota.p", FcmReply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", retry_after="120"))
        first, second = new_topic(), new_topic()
        await pipe.fcm("quota.p", first)
        await pipe.fcm("ok.second", second)
        await pipe.apns("ok.second", second)
        await pipe.webhook(receiver, second)

        await pipe.ingest(first, 1)
        # The quota answer is in once its retry is scheduled (120 s away): the channel is paused.
        await eventually(lambda: _delayed(queue), what="the quota retry")
        await pipe.ingest(second, 2)
        await eventually(lambda: apns_server.count == 1 and len(receiver.all_requests()) == 1, timeout=5)
        await asyncio.sleep(1.5)  # longer than a worker's read loop (1 s) takes to look again
        assert [r.token for r in fcm_server.requests] == ["quota.p"]
        # Both FCM hints wait for the pause to end: the quota retry, and the second one, still on the
        # stream or put back until the pause ends.
        assert await queue.depth(delivery_stream("fcm")) + await queue.delayed_count() == 2


@pytest.mark.slow
async def test_a_failed_fcm_push_is_tried_again_no_sooner_than_ten_seconds(
    start: Any, receiver: Receiver, fcm_server: FakeFcm
) -> None:
    # docs/hints.md#outcomes-retries-and-cleanup: FCM's floor, whatever the retry settings (0.05 s here).
    async with start() as pipe:
        topic = new_topic()
        fcm_server.script("flaky.e2e", FcmReply(500, "INTERNAL", "INTERNAL"), FcmReply(200))
        await pipe.fcm("flaky.e2e", topic)
        hook = receiver.endpoint([500, 200])
        member = await pipe.register(http=pb.HttpDelivery(url=hook.url, signing_key=hook.key))
        await pipe.subscribed(member, (topic,))

        await pipe.ingest(topic, 1)
        await eventually(lambda: fcm_server.count == 2, timeout=25, what="the FCM retry")
        await pipe.settled()
    first, second = fcm_server.requests
    assert second.received - first.received >= 10.0
    # The webhook's retry, on the same settings, came at once.
    hooked = [r.at for r in hook.requests]
    assert len(hooked) == 2 and hooked[1] - hooked[0] < 5.0


@pytest.mark.parametrize("outage", ["silent", "down"])
async def test_an_apns_outage_leaves_fcm_and_webhooks_flowing(
    start: Any, receiver: Receiver, apns_server: FakeApns, fcm_server: FakeFcm, tls: TlsFiles, outage: str
) -> None:
    overrides: dict[str, Any] = {"delivery_concurrency": 4, "provider_timeout_seconds": 5.0}
    if outage == "down":
        stopped = FakeApns(tls).start()
        overrides["apns_endpoint"] = stopped.endpoint
        stopped.stop()  # connections to it are refused
    async with start(**overrides) as pipe:
        apns_server.answering = False  # "silent": requests are read, never answered
        topics = [new_topic() for _ in range(3)]
        for i in range(12):  # three times the APNs worker's slots
            await pipe.apns(f"ok.outage{i}", *topics)
        await pipe.fcm("ok.flowing", *topics)
        await pipe.webhook(receiver, *topics)

        started = time.monotonic()
        for sequence_id, topic in enumerate(topics, 1):
            await pipe.ingest(topic, sequence_id)
        await eventually(lambda: fcm_server.count == 3 and len(receiver.all_requests()) == 3, timeout=5)
        assert time.monotonic() - started < 4.0  # not behind the APNs attempts (5 s timeouts, 4 slots)
        if outage == "silent":
            assert 0 < apns_server.count <= 4, apns_server.failures  # the APNs worker is stuck on its 4 slots


async def _delayed(queue: Any) -> bool:
    return bool(await queue.delayed_count())
