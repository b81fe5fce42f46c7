"""Legacy subscriptions through the whole pipeline (docs/legacy.md#from-envelope-to-push): devices
registered over the legacy API, envelopes taken in over `POST /v1/envelopes`, pushes out to the APNs
and FCM fakes and the operator's HTTP delivery, byte for byte, once per installation and envelope."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text

from app.proto.notifications.v1 import service_pb2 as lpb
from app.proto.xmtp.mls.api.v1 import mls_pb2
from fakes.fake_apns import FakeApns, Reply
from fakes.fake_fcm import FakeFcm
from fakes.keys import apns_key_pem, service_account
from fakes.webhook_receiver import Endpoint, Receiver
from tests.support import eventually
from tests.support import pipeline as pipeline_support
from tests.support.legacy import legacy_ok, register_request
from tests.support.pipeline import Pipeline, Stack, envelope, running_pipeline, wait_until

redis_url = pipeline_support.redis_url
some_stack = pipeline_support.some_stack
BUNDLE_ID = "org.example.legacy"
TIMESTAMP_NS = 1741283556527942000  # period 671
APNS_TOKEN, FCM_TOKEN, CUSTOM_TOKEN = "ab" * 32, "fcm-token-1", "custom-token-1"


@asynccontextmanager
async def legacy_pipeline(
    stack: Stack, fakes: tuple[FakeApns, FakeFcm], delivery: Endpoint, **overrides: Any
) -> AsyncIterator[Pipeline]:
    apns, fcm = fakes
    settings: dict[str, Any] = {
        "legacy_api_enabled": True,
        "legacy_http_delivery_url": delivery.url,
        "legacy_http_delivery_authorization": "Bearer operator-secret",
        "apns_key": apns_key_pem(),
        "apns_endpoint": apns.endpoint,
        "apns_ca_file": apns.tls.ca_file,
        "apns_bundle_id": BUNDLE_ID,
        "fcm_service_account": service_account(token_uri=fcm.token_uri),
        "fcm_endpoint": fcm.endpoint,
        **overrides,
    }
    async with running_pipeline(stack, **settings) as pipe:
        yield pipe


async def call(pipe: Pipeline, request: Any) -> Any:
    return await legacy_ok(pipe.http, request)


def topic_of(group_id: bytes) -> str:
    return f"/xmtp/mls/1/g-{group_id.hex()}/proto"


def group_message(group_id: bytes, data: bytes, sender_hmac: bytes = b"", should_push: bool = True) -> bytes:
    v1 = mls_pb2.GroupMessage.V1(
        id=7,
        created_ns=TIMESTAMP_NS,
        group_id=group_id,
        data=data,
        sender_hmac=sender_hmac,
        should_push=should_push,
    )
    return mls_pb2.GroupMessage(v1=v1).SerializeToString()


def ingested(group_id: bytes, sequence_id: int, message: bytes) -> dict[str, Any]:
    item = envelope(b"\x00" + group_id, sequence_id, server_ns=TIMESTAMP_NS)
    item["message"] = base64.b64encode(message).decode()
    return item


async def test_one_envelope_reaches_each_kind_of_installation_byte_for_byte(
    some_stack: Stack, fakes: tuple[FakeApns, FakeFcm], receiver: Receiver
) -> None:
    apns, fcm = fakes
    delivery = receiver.endpoint(signed=False)
    group_id = bytes(range(16))
    topic = topic_of(group_id)
    async with legacy_pipeline(some_stack, fakes, delivery) as pipe:
        await call(pipe, register_request("ios", apns_device_token=APNS_TOKEN))
        await call(pipe, register_request("android", firebase_device_token=FCM_TOKEN))
        await call(pipe, register_request("custom", custom_token=CUSTOM_TOKEN))
        for installation in ("ios", "android", "custom"):
            await call(pipe, lpb.SubscribeRequest(installation_id=installation, topics=[topic]))
        message = group_message(group_id, b"hello")
        await pipe.ingest_ok([ingested(group_id, 1, message)])
        await wait_until(lambda: len(apns.requests_for(APNS_TOKEN)) == 1, 15, "the APNs push")
        await wait_until(lambda: len(fcm.requests_for(FCM_TOKEN)) == 1, 15, "the FCM push")
        await wait_until(lambda: len(delivery.requests) == 1, 15, "the HTTP delivery")
        encrypted = base64.b64encode(message).decode()

        pushed = apns.requests_for(APNS_TOKEN)[0]
        assert pushed.body == (
            b'{"aps":{"alert":"New message from XMTP","mutable-content":1},"encryptedMessage":"'
            + encrypted.encode()
            + b'","messageKind":"v3-conversation","topic":"'
            + topic.encode()
            + b'"}'
        )
        assert (pushed.header("apns-push-type"), pushed.header("apns-topic")) == ("alert", BUNDLE_ID)
        data = {"topic": topic, "encryptedMessage": encrypted, "messageType": "v3-conversation"}
        document = fcm.requests_for(FCM_TOKEN)[0].json()["message"]
        assert (document["data"], document["android"]["data"], document["webpush"]["data"]) == (
            data,
            data,
            data,
        )
        posted = delivery.requests[0]
        assert posted.headers["authorization"] == "Bearer operator-secret"
        assert posted.payload["installation"] == {
            "id": "custom",
            "delivery_mechanism": {"kind": "custom", "token": CUSTOM_TOKEN},
        }
        assert posted.payload["message"]["timestamp_ns"] == TIMESTAMP_NS
        key = hashlib.sha1(topic.encode() + message, usedforsecurity=False).hexdigest()
        assert posted.payload["idempotency_key"] == key
        # The same envelope again (a retried ingest, another listener): nobody is pushed twice.
        await pipe.ingest_ok([ingested(group_id, 1, message)])
        await pipe.ingest_ok([ingested(group_id, 2, group_message(group_id, b"second"))])
        await wait_until(lambda: len(delivery.requests) == 2, 15, "the second envelope's delivery")
        await pipe.settled()
        assert (
            len(apns.requests_for(APNS_TOKEN)),
            len(fcm.requests_for(FCM_TOKEN)),
            len(delivery.requests),
        ) == (
            2,
            2,
            2,
        )


async def test_who_is_not_pushed(
    some_stack: Stack, fakes: tuple[FakeApns, FakeFcm], receiver: Receiver
) -> None:
    delivery = receiver.endpoint(signed=False)
    group_id = bytes(range(16, 32))
    topic = topic_of(group_id)
    key = b"\x2a" * 42
    async with legacy_pipeline(some_stack, fakes, delivery, apns_key=None, fcm_service_account=None) as pipe:
        for installation in ("sender", "reader", "deleted", "unsubscribed", "silent"):
            await call(pipe, register_request(installation, custom_token=f"t-{installation}"))
        sender = lpb.Subscription(
            topic=topic, hmac_keys=[lpb.Subscription.HmacKey(thirty_day_periods_since_epoch=671, key=key)]
        )
        await call(pipe, lpb.SubscribeWithMetadataRequest(installation_id="sender", subscriptions=[sender]))
        await call(
            pipe,
            lpb.SubscribeWithMetadataRequest(
                installation_id="silent", subscriptions=[lpb.Subscription(topic=topic, is_silent=True)]
            ),
        )
        for installation in ("reader", "deleted", "unsubscribed"):
            await call(pipe, lpb.SubscribeRequest(installation_id=installation, topics=[topic]))
        await call(pipe, lpb.DeleteInstallationRequest(installation_id="deleted"))
        await call(pipe, lpb.UnsubscribeRequest(installation_id="unsubscribed", topics=[topic]))
        signed = hmac.digest(key, b"from sender", hashlib.sha256)
        await pipe.ingest_ok([ingested(group_id, 1, group_message(group_id, b"from sender", signed))])
        await pipe.ingest_ok([ingested(group_id, 2, group_message(group_id, b"no push", should_push=False))])
        await wait_until(lambda: len(delivery.requests) == 2, 15, "the sender's message to the others")
        await pipe.settled()
        got = sorted(
            (r.payload["installation"]["id"], r.payload["subscription"]["is_silent"])
            for r in delivery.requests
        )
        assert got == [("reader", False), ("silent", True)]


async def test_a_dead_token_is_removed_and_its_subscriptions_kept(
    some_stack: Stack, fakes: tuple[FakeApns, FakeFcm], receiver: Receiver
) -> None:
    apns, _ = fakes
    group_id = bytes(range(32, 48))
    topic = topic_of(group_id)
    dead = "cd" * 32
    apns.script(dead, Reply(410, "Unregistered"))
    async with legacy_pipeline(some_stack, fakes, receiver.endpoint(signed=False)) as pipe:
        await call(pipe, register_request("gone", apns_device_token=dead))
        await call(pipe, lpb.SubscribeRequest(installation_id="gone", topics=[topic]))
        await pipe.ingest_ok([ingested(group_id, 1, group_message(group_id, b"x"))])
        await wait_until(lambda: len(apns.requests_for(dead)) == 1, 15, "the push to the dead token")

        async def token() -> Any:
            async with pipe.runtime.engine.connect() as connection:
                return (await connection.execute(text("SELECT token FROM legacy_installations"))).scalar_one()

        async def forgotten() -> bool:
            return await token() is None

        await eventually(forgotten, 15, "the dead token forgotten")
        async with pipe.runtime.engine.connect() as connection:
            rows = (await connection.execute(text("SELECT active FROM legacy_subscriptions"))).all()
        assert [tuple(r) for r in rows] == [(True,)]


async def test_a_welcome_to_a_silent_subscription_wakes_the_app_in_the_background(
    some_stack: Stack, fakes: tuple[FakeApns, FakeFcm], receiver: Receiver
) -> None:
    apns, _ = fakes
    installation_key = bytes(range(100, 132))
    topic = f"/xmtp/mls/1/w-{installation_key.hex()}/proto"
    token = "ef" * 32
    async with legacy_pipeline(some_stack, fakes, receiver.endpoint(signed=False)) as pipe:
        await call(pipe, register_request("welcomed", apns_device_token=token))
        silent = lpb.Subscription(topic=topic, is_silent=True)
        await call(pipe, lpb.SubscribeWithMetadataRequest(installation_id="welcomed", subscriptions=[silent]))
        # Welcomes are pushed whatever they say of should_push.
        await pipe.ingest_ok([envelope(b"\x01" + installation_key, 9, kind="welcome", should_push=False)])
        await wait_until(lambda: len(apns.requests_for(token)) == 1, 15, "the welcome's push")
        pushed = apns.requests_for(token)[0]
        assert (pushed.header("apns-push-type"), pushed.header("apns-priority")) == ("background", "5")
        body = pushed.json()
        assert body["aps"] == {"content-available": 1}
        assert (body["messageKind"], body["topic"]) == ("v3-welcome", topic)
        welcome = mls_pb2.WelcomeMessage.FromString(base64.b64decode(body["encryptedMessage"]))
        assert (welcome.v1.id, welcome.v1.installation_key) == (9, installation_key)
