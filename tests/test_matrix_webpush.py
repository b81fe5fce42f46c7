"""The gateway's `webpush` apps through the route, to a Web Push service on a real local port.

Every push is decrypted by the fake service with http_ece using the subscriber's private key and its
VAPID token verified; what arrives must be the notification's fields as JSON. A subscription the
service calls gone is rejected; other failures, refused endpoints included, answer 502.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.core.config import SettingsError
from app.delivery.providers.webpush import collapse_header
from app.matrix.config import load_gateway_config
from fakes.fake_webpush import FakeWebPush, Subscription
from tests.support.matrix import RunningGateway, gateway_settings, running, write_config

APP_ID = "org.example.web"
LOCAL = {
    "webhook_allow_private_addresses": True,
    "webhook_allow_insecure": True,
    "matrix_request_timeout_seconds": 3,
}


def vapid_file(folder: Path) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    path = folder / "vapid.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(path)


def webpush_app(key_file: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "type": "webpush",
        "vapid_private_key": key_file,
        "vapid_contact_email": "ops@example.org",
        "ttl": 300,
    }
    values.update(overrides)
    return values


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    key_file = vapid_file(tmp_path)
    apps = {
        APP_ID: webpush_app(key_file),
        "org.example.web.latest": webpush_app(key_file, only_last_per_room=True),
        "org.example.web.listed": webpush_app(key_file, allowed_endpoints=["push.example.org"]),
    }
    async with running(gateway_settings(write_config(tmp_path, apps), **LOCAL)) as running_gateway:
        yield running_gateway


def subscriber(subscription: Subscription, app_id: str = APP_ID, **data: Any) -> dict[str, Any]:
    keys = subscription.keys
    return {
        "app_id": app_id,
        "pushkey": subscription.endpoint,
        "pushkey_ts": 1700000000,
        "data": {"p256dh": keys.p256dh, "auth": keys.auth, **data},
    }


def message(*devices: dict[str, Any], **fields: Any) -> dict[str, Any]:
    notification: dict[str, Any] = {
        "event_id": "$event:example.org",
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "sender_display_name": "Alice",
        "room_name": "Tea",
        "counts": {"unread": 3},
        "prio": "high",
        "content": {"msgtype": "m.text", "body": "hi", "formatted_body": "<b>hi</b>"},
        "devices": list(devices),
    }
    notification.update(fields)
    return notification


async def test_a_notification_arrives_as_its_fields_encrypted_to_the_subscription(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    answer = await gateway.notify(message(subscriber(subscription, default_payload={"app": "web"})))
    assert (answer.status_code, answer.json()) == (200, {"rejected": []})
    assert service.failures == []
    [pushed] = subscription.pushes
    assert json.loads(pushed.payload) == {
        "app": "web",
        "event_id": "$event:example.org",
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "sender_display_name": "Alice",
        "room_name": "Tea",
        "unread": 3,
        "content": {"msgtype": "m.text", "body": "hi"},
    }
    assert pushed.claims["sub"] == "mailto:ops@example.org"
    assert (pushed.headers["ttl"], pushed.headers["urgency"]) == ("300", "normal")
    assert "topic" not in pushed.headers


async def test_sygnals_subscription_form_and_low_priority(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    keys = subscription.keys
    device = {
        "app_id": APP_ID,
        "pushkey": keys.p256dh,
        "data": {"endpoint": subscription.endpoint, "auth": keys.auth},
    }
    answer = await gateway.notify(message(device, prio="low"))
    assert (answer.status_code, answer.json()) == (200, {"rejected": []})
    [pushed] = subscription.pushes
    assert pushed.headers["urgency"] == "low"
    assert json.loads(pushed.payload)["event_id"] == "$event:example.org"


async def test_only_last_per_room_lets_a_newer_push_replace_a_queued_one(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    by_app, by_pusher = service.subscribe(), service.subscribe()
    await gateway.notify(message(subscriber(by_app, "org.example.web.latest")))
    await gateway.notify(message(subscriber(by_pusher, only_last_per_room=True)))
    expected = collapse_header("!room:example.org")
    assert [p.headers["topic"] for p in by_app.pushes + by_pusher.pushes] == [expected, expected]


async def test_a_long_body_is_cut_and_a_long_ciphertext_left_out(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    content = {"body": "x" * 1500, "ciphertext": "c" * 2500, "algorithm": "m.megolm.v1.aes-sha2"}
    await gateway.notify(message(subscriber(subscription), content=content))
    shown = json.loads(subscription.pushes[0].payload)["content"]
    assert shown == {"body": "x" * 999 + "…", "algorithm": "m.megolm.v1.aes-sha2"}


@pytest.mark.parametrize(("status", "rejected"), [(404, True), (410, True), (400, False), (429, False)])
async def test_a_gone_subscription_is_rejected_and_other_failures_are_502(
    gateway: RunningGateway, service: FakeWebPush, status: int, rejected: bool
) -> None:
    # 429's Retry-After is past the request's time: answered at once, the homeserver retries later.
    subscription = service.subscribe(statuses=(status,), **{"retry-after": "60"})
    answer = await gateway.notify(message(subscriber(subscription)))
    if rejected:
        assert (answer.status_code, answer.json()) == (200, {"rejected": [subscription.endpoint]})
    else:
        assert answer.status_code == 502
    assert len(subscription.pushes) == 1


async def test_a_server_error_is_retried_within_the_request(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe(statuses=(500, 201))
    answer = await gateway.notify(message(subscriber(subscription)))
    assert (answer.status_code, answer.json()) == (200, {"rejected": []})
    assert [json.loads(p.payload)["event_id"] for p in subscription.pushes] == ["$event:example.org"] * 2


async def test_a_subscription_without_usable_keys_is_rejected_without_a_request(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    no_auth = subscriber(subscription)
    del no_auth["data"]["auth"]
    bad_point = subscriber(subscription)
    bad_point["data"]["p256dh"] = "BAAA"
    for device in (no_auth, bad_point):
        answer = await gateway.notify(message(device))
        assert (answer.status_code, answer.json()) == (200, {"rejected": [subscription.endpoint]})
    assert subscription.pushes == []


async def test_a_badge_update_for_an_events_only_pusher_sends_nothing(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    badge = {"devices": [subscriber(subscription, events_only=True)], "counts": {"unread": 1}}
    answer = await gateway.notify(badge)
    assert (answer.status_code, answer.json()) == (200, {"rejected": []})
    assert subscription.pushes == []


async def test_an_endpoint_outside_allowed_endpoints_is_502_without_a_request(
    gateway: RunningGateway, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    answer = await gateway.notify(message(subscriber(subscription, "org.example.web.listed")))
    assert answer.status_code == 502
    assert subscription.pushes == []


async def test_a_private_endpoint_is_502_without_a_request_unless_allowed(
    tmp_path: Path, service: FakeWebPush
) -> None:
    config = write_config(tmp_path, {APP_ID: webpush_app(vapid_file(tmp_path))})
    subscription = service.subscribe()
    async with running(gateway_settings(config, webhook_allow_insecure=True)) as strict:
        answer = await strict.notify(message(subscriber(subscription)))
    assert answer.status_code == 502
    assert subscription.pushes == []


@pytest.mark.parametrize(
    ("overrides", "message_start"),
    [
        ({"vapid_private_key": None}, "apps.org.example.web.vapid_private_key: required"),
        ({"vapid_private_key": "/nonexistent.pem"}, "apps.org.example.web.vapid_private_key: not a readable"),
        ({"vapid_contact_email": None}, "apps.org.example.web.vapid_contact_email: required"),
        ({"ttl": "soon"}, "apps.org.example.web.ttl: must be a whole number"),
        ({"allowed_endpoints": "push.example.org"}, "apps.org.example.web.allowed_endpoints: must be a list"),
        (
            {"max_connections": 0},
            "apps.org.example.web.max_connections: must be a whole number of at least 1",
        ),
        ({"only_last_per_room": "yes"}, "apps.org.example.web.only_last_per_room: must be true or false"),
    ],
)
def test_a_bad_webpush_app_stops_start_up_naming_the_key(
    tmp_path: Path, overrides: dict[str, Any], message_start: str
) -> None:
    values = {k: v for k, v in webpush_app(vapid_file(tmp_path), **overrides).items() if v is not None}
    with pytest.raises(SettingsError) as raised:
        load_gateway_config(write_config(tmp_path, {APP_ID: values}))
    assert message_start in str(raised.value)
    assert "PRIVATE KEY" not in str(raised.value)
