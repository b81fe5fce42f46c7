"""The legacy API's pushes, byte for byte, rendered and then sent through the real providers to the
fakes of APNs (HTTP/2), FCM and a webhook receiver.

Contract: docs/legacy.md#payloads-channel-by-channel. The expected documents are written out here from
the contract, with the test vector's message (docs/legacy.md#test-vector).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from standardwebhooks.webhooks import Webhook

from app.core.channels import Channel
from app.delivery.credentials import apns_credentials
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookProvider
from app.delivery.types import OutcomeKind
from app.legacy.payloads import (
    HTTP_DELIVERY_APP,
    LegacyDelivery,
    PayloadSettings,
    channel_for,
    go_string,
    http_delivery_config,
    render,
    rfc3339,
)
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.webhook_receiver import Receiver
from tests.support import make_settings
from tests.support.fcm import new_provider

TOPIC = "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e0f/proto"
WELCOME_TOPIC = "/xmtp/mls/1/w-" + "ab" * 32 + "/proto"
B64 = "ClsIBxDw0s6AtIWSlRgaEAABAgMEBQYHCAkKCwwNDg8iF2xlZ2FjeSBwdXNoIHRlc3QgdmVjdG9yKiDTzaB7M+ug8QJgJdCBGTVL4OfjUgigUFy9j5p4/191tjAB"
TIMESTAMP_NS = 1_741_283_556_527_942_000  # above 2^53: must stay exact
ALERT = "New message from XMTP"
BUNDLE_ID = "org.example.app"
SETTINGS = PayloadSettings(alert_text=ALERT)


def delivery(**changes: object) -> LegacyDelivery:
    values: dict[str, object] = {
        "topic": TOPIC,
        "message": base64.b64decode(B64),
        "timestamp_ns": TIMESTAMP_NS,
        "idempotency_key": "f674ca6c319e2677c05509d0a63336fcbfdb187f",
        "installation_id": "installation-1",
        "mechanism": "apns",
        "token": "ok.legacy",
        "is_silent": False,
        "created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "should_push": True,
    }
    values.update(changes)
    return LegacyDelivery(**values)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- APNs


@pytest.fixture
async def apns(apns_server: FakeApns) -> AsyncIterator[ApnsProvider]:
    apns_server.reset()
    settings = make_settings(
        "sqlite+aiosqlite:///unused.db",
        apns_endpoint=apns_server.endpoint,
        apns_ca_file=apns_server.tls.ca_file,
    )
    credentials = apns_credentials(settings)
    assert credentials is not None
    provider = ApnsProvider(credentials, timeout_seconds=5.0)
    yield provider
    await provider.close()
    assert apns_server.failures == []


async def test_apns_alert_is_the_contracts_bytes_on_the_wire(
    apns_server: FakeApns, apns: ApnsProvider
) -> None:
    outcome = await apns.send(render(Channel.APNS, delivery(), SETTINGS))

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = apns_server.requests
    assert (
        request.body
        == (
            '{"aps":{"alert":"New message from XMTP","mutable-content":1},'
            f'"encryptedMessage":"{B64}","messageKind":"v3-conversation","topic":"{TOPIC}"}}'
        ).encode()
    )
    assert len(request.body) == 302
    assert request.path == "/3/device/ok.legacy"
    assert request.header("apns-push-type") == "alert"
    assert request.header("apns-priority") in ("10", None)
    assert request.header("apns-topic") == BUNDLE_ID
    assert request.header("apns-collapse-id") is None
    assert request.header("apns-expiration") is None


async def test_apns_silent_is_a_background_push_at_priority_5(
    apns_server: FakeApns, apns: ApnsProvider
) -> None:
    push = render(Channel.APNS, delivery(topic=WELCOME_TOPIC, is_silent=True, should_push=None), SETTINGS)
    outcome = await apns.send(push)

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = apns_server.requests
    assert (
        request.body
        == (
            '{"aps":{"content-available":1},'
            f'"encryptedMessage":"{B64}","messageKind":"v3-welcome","topic":"{WELCOME_TOPIC}"}}'
        ).encode()
    )
    assert request.header("apns-push-type") == "background"
    assert request.header("apns-priority") == "5"
    assert request.header("apns-collapse-id") is None


async def test_apns_topic_is_the_bundle_id_given(apns_server: FakeApns, apns: ApnsProvider) -> None:
    settings = replace(SETTINGS, bundle_id="org.example.other")
    await apns.send(render(Channel.APNS, delivery(), settings))
    [request] = apns_server.requests
    assert request.header("apns-topic") == "org.example.other"


async def test_a_welcome_too_large_for_apns_is_rejected(apns_server: FakeApns, apns: ApnsProvider) -> None:
    outcome = await apns.send(render(Channel.APNS, delivery(message=bytes(3000)), SETTINGS))
    assert outcome.kind is OutcomeKind.REJECTED


def test_the_alert_text_is_written_as_go_writes_it() -> None:
    push = render(Channel.APNS, delivery(), PayloadSettings(alert_text='Hi & <"you"> ✉'))
    assert isinstance(push.payload, bytes)
    assert push.payload.startswith(
        '{"aps":{"alert":"Hi \\u0026 \\u003c\\"you\\"\\u003e ✉","mutable-content":1}'.encode()
    )


# --------------------------------------------------------------------------- FCM


@pytest.fixture(scope="module")
async def fcm(fcm_server: FakeFcm) -> AsyncIterator[FcmProvider]:
    provider = new_provider(fcm_server)
    yield provider
    await provider.close()


def fcm_document(token: str, kind: str, topic: str, *, silent: bool) -> dict[str, object]:
    data = {"topic": topic, "encryptedMessage": B64, "messageType": kind}
    aps = {"content-available": 1} if silent else {"mutable-content": 1}
    headers = {"apns-push-type": "background", "apns-priority": "5"} if silent else {}
    return {
        "message": {
            "token": token,
            "data": data,
            "android": {"priority": "NORMAL" if silent else "HIGH", "data": data},
            "webpush": {"data": data, "notification": {"title": ALERT}},
            "apns": {"headers": headers, "payload": {"aps": aps, **data}},
        }
    }


async def test_fcm_is_the_contracts_document_on_the_wire(fcm_server: FakeFcm, fcm: FcmProvider) -> None:
    fcm_server.reset()
    outcome = await fcm.send(render(Channel.FCM, delivery(mechanism="fcm", token="ok.fcm"), SETTINGS))

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = fcm_server.requests
    assert request.json() == fcm_document("ok.fcm", "v3-conversation", TOPIC, silent=False)


async def test_fcm_silent(fcm_server: FakeFcm, fcm: FcmProvider) -> None:
    fcm_server.reset()
    push = render(
        Channel.FCM, delivery(mechanism="fcm", token="ok.fcm", topic=WELCOME_TOPIC, is_silent=True), SETTINGS
    )
    await fcm.send(push)

    [request] = fcm_server.requests
    assert request.json() == fcm_document("ok.fcm", "v3-welcome", WELCOME_TOPIC, silent=True)


# --------------------------------------------------------------------------- the HTTP delivery

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HTTP_BODY = (
    '{"idempotency_key":"f674ca6c319e2677c05509d0a63336fcbfdb187f",'
    f'"message":{{"content_topic":"{TOPIC}","timestamp_ns":1741283556527942000,"message":"{B64}"}},'
    '"message_context":{"message_type":"v3-conversation","should_push":true},'
    '"installation":{"id":"installation-1","delivery_mechanism":{"kind":"apns","token":"ok.legacy"}},'
    f'"subscription":{{"created_at":"2026-01-02T03:04:05Z","topic":"{TOPIC}","is_silent":false}}}}'
).encode()


@pytest.fixture
async def operator() -> AsyncIterator[WebhookProvider]:
    provider = WebhookProvider.from_config(http_delivery_config(), 5.0, app=HTTP_DELIVERY_APP)
    yield provider
    await provider.close()


def http_settings(url: str, **changes: object) -> PayloadSettings:
    return replace(SETTINGS, http_url=url, **changes)  # type: ignore[arg-type]


async def test_http_delivery_is_the_go_servers_body_with_the_authorization(
    receiver: Receiver, operator: WebhookProvider
) -> None:
    endpoint = receiver.endpoint(signed=False)
    settings = http_settings(endpoint.url, http_authorization="Bearer operator secret")
    outcome = await operator.send(render(Channel.HTTP, delivery(), settings))

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = endpoint.requests
    assert request.body == HTTP_BODY
    assert json.loads(request.body)["message"]["timestamp_ns"] == TIMESTAMP_NS  # exact, above 2^53
    assert request.headers["authorization"] == "Bearer operator secret"
    assert request.headers["content-type"] == "application/json"
    assert "webhook-signature" not in request.headers


async def test_http_delivery_leaves_out_what_is_absent(receiver: Receiver, operator: WebhookProvider) -> None:
    endpoint = receiver.endpoint(signed=False)
    welcome = delivery(topic=WELCOME_TOPIC, message=b"", should_push=None, mechanism="custom", is_silent=True)
    await operator.send(render(Channel.HTTP, welcome, http_settings(endpoint.url)))

    [request] = endpoint.requests
    document = json.loads(request.body)
    assert document["message"] == {"content_topic": WELCOME_TOPIC, "timestamp_ns": TIMESTAMP_NS}
    assert document["message_context"] == {"message_type": "v3-welcome"}
    assert document["installation"]["delivery_mechanism"] == {"kind": "custom", "token": "ok.legacy"}
    assert document["subscription"]["is_silent"] is True
    assert "authorization" not in request.headers


async def test_http_delivery_signed_verifies_over_the_exact_body(
    receiver: Receiver, operator: WebhookProvider
) -> None:
    key = bytes(range(32))
    endpoint = receiver.endpoint(key=key)
    settings = http_settings(endpoint.url, http_signing_key=key, http_authorization="Basic b3A=")
    first, other = delivery(), delivery(installation_id="installation-2")
    await operator.send(render(Channel.HTTP, first, settings))
    await operator.send(render(Channel.HTTP, first, settings))
    await operator.send(render(Channel.HTTP, other, settings))

    requests = endpoint.requests
    assert len(requests) == 3  # each verified by the receiver with the key, over the bytes sent
    assert requests[0].body == HTTP_BODY
    Webhook(key).verify(requests[0].body, requests[0].headers)
    assert requests[0].headers["authorization"] == "Basic b3A="
    ids = [r.headers["webhook-id"] for r in requests]
    assert ids[0] == ids[1] != ids[2]  # one per delivery, the same for every attempt


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, OutcomeKind.DELIVERED),
        (204, OutcomeKind.DELIVERED),
        (500, OutcomeKind.FAILED),
        (503, OutcomeKind.FAILED),
        (404, OutcomeKind.REJECTED),
        (410, OutcomeKind.REJECTED),
        (400, OutcomeKind.REJECTED),
        (401, OutcomeKind.REJECTED),
        (302, OutcomeKind.REJECTED),
    ],
)
async def test_http_delivery_answers_never_mean_dead(
    receiver: Receiver, operator: WebhookProvider, status: int, expected: OutcomeKind
) -> None:
    endpoint = receiver.endpoint([status], signed=False)
    outcome = await operator.send(render(Channel.HTTP, delivery(), http_settings(endpoint.url)))
    assert outcome.kind is expected


async def test_a_receivers_webhook_still_dies_on_gone(receiver: Receiver) -> None:
    """The option is the operator endpoint's: a receiver registered through the new API is gone on 410."""
    provider = WebhookProvider(http_delivery_config().policy, 5.0)
    endpoint = receiver.endpoint([410], signed=False)
    try:
        outcome = await provider.send(render(Channel.HTTP, delivery(), http_settings(endpoint.url)))
    finally:
        await provider.close()
    assert outcome.kind is OutcomeKind.DEAD


def test_http_delivery_without_a_url_is_not_rendered() -> None:
    with pytest.raises(ValueError):
        render(Channel.HTTP, delivery(), SETTINGS)


# --------------------------------------------------------------------------- the parts


@pytest.mark.parametrize(
    ("moment", "written"),
    [
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC), "2026-01-02T03:04:05.12Z"),
        (datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))), "2026-01-02T03:04:05Z"),
        (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05Z"),  # naive: taken as UTC
    ],
)
def test_created_at_is_rfc3339_utc_with_z(moment: datetime, written: str) -> None:
    assert rfc3339(moment) == written


def test_go_strings() -> None:
    assert go_string("plain") == '"plain"'
    assert go_string("é\n\u2028") == '"é\\n\\u2028"'
    assert go_string("<a&b>") == '"\\u003ca\\u0026b\\u003e"'


@pytest.mark.parametrize(
    ("mechanism", "apns", "fcm", "http", "expected"),
    [
        ("apns", True, True, True, Channel.APNS),
        ("fcm", True, True, True, Channel.FCM),
        ("custom", True, True, True, Channel.HTTP),
        ("apns", False, True, True, Channel.HTTP),
        ("fcm", True, False, True, Channel.HTTP),
        ("apns", False, True, False, None),
        ("custom", True, True, False, None),
    ],
)
def test_the_first_channel_that_fits(
    mechanism: str, apns: bool, fcm: bool, http: bool, expected: Channel | None
) -> None:
    assert channel_for(mechanism, apns=apns, fcm=fcm, http=http) is expected


def test_a_topic_of_neither_form_is_never_rendered() -> None:
    with pytest.raises(ValueError):
        render(Channel.APNS, delivery(topic="/xmtp/0/invite-1/proto"), SETTINGS)
