"""The Matrix push gateway over real HTTP: `xmtp-push gateway` against the local APNs and FCM fakes.

Nothing of ours is replaced: uvicorn, the route, the gateway, the APNs provider (aioapns, h2, TLS)
and the FCM provider (firebase-admin, httpx) run for real; only Apple's and Google's endpoints are
the fakes in fakes/, which record every request and answer per token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import jwt
import pytest

from fakes import keys
from fakes.fake_apns import FakeApns
from fakes.fake_apns import Reply as ApnsReply
from fakes.fake_fcm import FakeFcm
from fakes.fake_fcm import Reply as FcmReply
from tests.support.matrix import (
    KEY_ID,
    TEAM_ID,
    TOPIC,
    RunningGateway,
    apns_app,
    b64,
    device,
    event_id_only,
    gateway_settings,
    gcm_app,
    running,
    write_config,
    write_key_files,
)

IOS, RAW, ANDROID = "org.example.ios", "org.example.raw", "org.example.android"
# Apps that send no counts (send_badge_counts: false).
NO_BADGE_IOS, NO_BADGE_ANDROID = "org.nobadge.ios", "org.nobadge.android"
FCM_OPTIONS = {"android": {"ttl": "60s", "priority": "normal"}, "fcm_options": {"analytics_label": "matrix"}}


@pytest.fixture
def apns(apns_server: FakeApns) -> Iterator[FakeApns]:
    apns_server.reset()
    yield apns_server
    assert apns_server.failures == []


@pytest.fixture
def fcm(fcm_server: FakeFcm) -> FakeFcm:
    fcm_server.reset()
    return fcm_server


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, apns_server: FakeApns, fcm_server: FakeFcm) -> str:
    folder = tmp_path_factory.mktemp("matrix-config")
    keyfile, account = write_key_files(folder, fcm_server)
    apps = {
        IOS: apns_app(apns_server, keyfile),
        RAW: apns_app(apns_server, keyfile, convert_device_token_to_hex=False, push_type="voip"),
        ANDROID: gcm_app(fcm_server, account, fcm_options=FCM_OPTIONS),
        # Globs: an exact key wins over them; two that match one id make it ambiguous.
        "im.glob.*": apns_app(apns_server, keyfile, convert_device_token_to_hex=False),
        "im.glob.exact": gcm_app(fcm_server, account),
        "amb.*.x": apns_app(apns_server, keyfile, convert_device_token_to_hex=False),
        "amb.a.*": apns_app(apns_server, keyfile, convert_device_token_to_hex=False),
        "one.?": apns_app(apns_server, keyfile, convert_device_token_to_hex=False),
        NO_BADGE_IOS: apns_app(
            apns_server, keyfile, convert_device_token_to_hex=False, send_badge_counts=False
        ),
        NO_BADGE_ANDROID: gcm_app(fcm_server, account, send_badge_counts=False),
    }
    return write_config(folder, apps)


@pytest.fixture(scope="module")
async def gateway(config_path: str) -> AsyncIterator[RunningGateway]:
    async with running(gateway_settings(config_path, matrix_request_timeout_seconds=3)) as started:
        yield started


def event() -> str:
    return f"${uuid.uuid4().hex}:example.org"


def raw(name: str) -> dict[str, Any]:
    """A device of the app that sends pushkeys to APNs as they are (the fake answers by name)."""
    return device(RAW, f"{name}.{uuid.uuid4().hex[:8]}")


# --------------------------------------------------------------------------- APNs requests


async def test_event_id_only_to_apns_is_the_default_payload_with_ids_and_counts(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    token = bytes(range(32))
    default_payload = {"aps": {"mutable-content": 1, "alert": {"loc-key": "SINGLE_UNREAD"}}, "app": "x"}
    event_id = event()
    notification = event_id_only(
        device(IOS, b64(token), format="event_id_only", default_payload=default_payload),
        event_id=event_id,
        counts={"unread": 3, "missed_calls": 1},
    )
    response = await gateway.notify(notification)
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    [request] = apns.requests
    assert request.path == "/3/device/" + token.hex()  # base64 pushkey sent as hex
    assert request.header("apns-topic") == TOPIC
    assert request.header("apns-priority") == "10"
    assert request.header("apns-push-type") is None  # the app sets no push_type: none sent, as Sygnal
    assert request.header("apns-expiration") is None
    assert request.header("apns-collapse-id") is None
    claims = jwt.decode(request.jwt, keys.apns_key().public_key(), algorithms=["ES256"])
    assert claims["iss"] == TEAM_ID and jwt.get_unverified_header(request.jwt)["kid"] == KEY_ID
    assert request.json() == {
        **default_payload,
        "room_id": "!room:example.org",
        "event_id": event_id,
        "unread_count": 3,
        "missed_calls": 1,
    }


async def test_low_priority_is_apns_priority_5_and_push_type_comes_from_the_app(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    pushkey = f"ok.{uuid.uuid4().hex[:8]}"
    response = await gateway.notify(event_id_only(device(RAW, pushkey), event_id=event(), prio="low"))
    assert response.status_code == 200
    [request] = apns.requests
    assert request.path == "/3/device/" + pushkey  # convert_device_token_to_hex: false
    assert (request.header("apns-priority"), request.header("apns-push-type")) == ("5", "voip")


async def test_an_apns_app_without_push_type_sends_no_push_type_header(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    # As Sygnal: the header only when the app configures push_type, whatever the format.
    pushkey = b64(bytes(range(32)))
    message = {
        "type": "m.room.message",
        "sender": "@a:example.org",
        "content": {"msgtype": "m.text", "body": "hi"},
    }
    notifications = [
        event_id_only(device(IOS, pushkey), event_id=event()),
        event_id_only(device(IOS, pushkey), event_id=event(), **message),
        {"counts": {"unread": 1}, "devices": [device(IOS, pushkey)]},  # badge only
        event_id_only(raw("ok"), event_id=event()),
    ]
    for notification in notifications:
        response = await gateway.notify(notification)
        assert (response.status_code, response.json()) == (200, {"rejected": []})
    sent = [[value for name, value in r.headers if name == "apns-push-type"] for r in apns.requests]
    assert sent == [[], [], [], ["voip"]]


async def test_full_format_is_an_alert_with_loc_key_loc_args_and_badge(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    event_id = event()
    notification = {
        "event_id": event_id,
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "sender_display_name": "Alice",
        "room_name": "Lunch",
        "prio": "high",
        "content": {"msgtype": "m.text", "body": "Hello there"},
        "counts": {"unread": 4, "missed_calls": 2},
        "devices": [raw("ok")],
    }
    assert (await gateway.notify(notification)).status_code == 200
    assert apns.requests[0].json() == {
        "aps": {
            "alert": {
                "loc-key": "MSG_FROM_USER_IN_ROOM_WITH_CONTENT",
                "loc-args": ["Alice", "Lunch", "Hello there"],
            },
            "badge": 6,
        },
        "room_id": "!room:example.org",
        "event_id": event_id,
    }


async def test_badge_only_update_is_aps_badge(gateway: RunningGateway, apns: FakeApns) -> None:
    # What a homeserver sends when a user reads a room: no event, "type": null, empty sender.
    notification = {"id": "", "type": None, "sender": "", "counts": {"unread": 5}, "devices": [raw("ok")]}
    assert (await gateway.notify(notification)).status_code == 200
    assert apns.requests[0].json() == {"aps": {"badge": 5}}


async def test_a_long_message_is_shortened_to_4096_bytes_by_its_fields(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    body = "é" * 3000 + "x"  # 6001 bytes, over the body limit alone
    notification = {
        "event_id": event(),
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@bob:example.org",
        "content": {"msgtype": "m.text", "body": body},
        "devices": [raw("ok")],
    }
    assert (await gateway.notify(notification)).status_code == 200
    request = apns.requests[0]
    assert 4000 < len(request.body) <= 4096
    sent = request.json()["aps"]["alert"]
    assert sent["loc-key"] == "MSG_FROM_USER_WITH_CONTENT"
    assert sent["loc-args"][0] == "@bob:example.org"  # short fields stay whole
    assert body.startswith(sent["loc-args"][1])  # the long one lost its end


# --------------------------------------------------------------------------- FCM v1 bodies


async def test_event_id_only_to_fcm_is_a_data_message_of_strings(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    event_id = event()
    notification = event_id_only(
        device(ANDROID, "ok.1", default_payload={"flag": True, "n": 2, "text": "t"}),
        event_id=event_id,
        prio="low",
    )
    assert (await gateway.notify(notification)).status_code == 200
    [request] = fcm.requests
    assert request.path == "/v1/projects/matrix-project/messages:send"
    assert request.headers["authorization"] == "Bearer test-token"
    assert request.json() == {
        "message": {
            "token": "ok.1",
            "data": {
                "flag": "true",
                "n": "2",
                "text": "t",
                "event_id": event_id,
                "room_id": "!room:example.org",
                "prio": "normal",
                "unread": "2",  # no missed_calls in the request: none sent, never "None"
            },
            "android": {"ttl": "60s", "priority": "NORMAL"},
            "fcm_options": {"analytics_label": "matrix"},
        }
    }


async def test_full_format_to_fcm_flattens_content_and_cuts_long_fields(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    event_id = event()
    notification = {
        "event_id": event_id,
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "sender_display_name": "A" * 2000,
        "room_alias": "#lunch:example.org",
        "content": {"msgtype": "m.text", "body": "hi", "format": None, "info": {"w": 1}},
        "counts": {"unread": 0, "missed_calls": 1},
        "devices": [device(ANDROID, "ok.2")],
    }
    assert (await gateway.notify(notification)).status_code == 200
    data = fcm.requests[0].json()["message"]["data"]
    assert data == {
        "event_id": event_id,
        "room_id": "!room:example.org",
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "sender_display_name": "A" * 1021 + "…",
        "room_alias": "#lunch:example.org",
        "content_msgtype": "m.text",
        "content_body": "hi",
        "prio": "high",
        "unread": "0",
        "missed_calls": "1",
    }
    assert fcm.requests[0].json()["message"]["android"]["priority"] == "HIGH"  # ours over fcm_options


# --------------------------------------------------------------------------- send_badge_counts: false


async def test_an_app_without_badge_counts_sends_events_without_them(
    gateway: RunningGateway, apns: FakeApns, fcm: FakeFcm
) -> None:
    counts = {"unread": 3, "missed_calls": 1}
    event_id = event()
    ios, android = device(NO_BADGE_IOS, "ok.nobadge"), device(NO_BADGE_ANDROID, "ok.nobadge")
    response = await gateway.notify(event_id_only(ios, android, event_id=event_id, counts=counts))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert apns.requests[0].json() == {"room_id": "!room:example.org", "event_id": event_id}
    data = fcm.requests[0].json()["message"]["data"]
    assert data == {"event_id": event_id, "room_id": "!room:example.org", "prio": "high"}
    message = {
        "type": "m.room.message",
        "sender": "@bob:example.org",
        "content": {"msgtype": "m.text", "body": "hi"},
    }
    full = {**event_id_only(device(NO_BADGE_IOS, "ok.full"), event_id=event(), counts=counts), **message}
    assert (await gateway.notify(full)).status_code == 200
    aps = apns.requests_for("ok.full")[0].json()["aps"]
    assert aps == {"alert": {"loc-key": "MSG_FROM_USER_WITH_CONTENT", "loc-args": ["@bob:example.org", "hi"]}}


async def test_an_app_without_badge_counts_sends_no_badge_only_update_and_rejects_nothing(
    gateway: RunningGateway, apns: FakeApns, fcm: FakeFcm
) -> None:
    devices = [device(NO_BADGE_IOS, "ok.badge"), device(NO_BADGE_ANDROID, "ok.badge"), raw("ok")]
    notification = {"id": "", "type": None, "sender": "", "counts": {"unread": 5}, "devices": devices}
    response = await gateway.notify(notification)
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert [r.token for r in apns.requests] == [devices[2]["pushkey"]]  # the app with counts only
    assert fcm.requests == []


# --------------------------------------------------------------------------- routing


async def test_globs_route_and_an_exact_app_id_wins(
    gateway: RunningGateway, apns: FakeApns, fcm: FakeFcm
) -> None:
    by_glob = device("im.glob.anything", "ok.glob")
    exact = device("im.glob.exact", "ok.exact")  # also matched by im.glob.*: exact wins (the FCM app)
    single = device("one.x", "ok.single")
    response = await gateway.notify(event_id_only(by_glob, exact, single, event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert sorted(r.token for r in apns.requests) == ["ok.glob", "ok.single"]
    assert [r.token for r in fcm.requests] == ["ok.exact"]


async def test_unknown_ambiguous_and_overlong_app_ids_are_rejected(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    devices = [
        device("org.unknown", "key-unknown"),
        device("amb.a.x", "key-ambiguous"),  # amb.*.x and amb.a.*
        device("one.xy", "key-not-one-char"),
        device("im.glob." + "a" * 60, "key-long-id"),  # 68 characters
        device("amb.a.y", "ok.served"),  # only amb.a.*
    ]
    response = await gateway.notify(event_id_only(*devices, event_id=event()))
    assert response.status_code == 200
    assert response.json() == {
        "rejected": ["key-unknown", "key-ambiguous", "key-not-one-char", "key-long-id"]
    }
    assert [r.token for r in apns.requests] == ["ok.served"]


# --------------------------------------------------------------------------- rejected and 502


@pytest.mark.parametrize("name", ["gone", "bad", "topic", "topicdisallowed"])
async def test_apns_token_errors_reject_the_pushkey_as_sent(
    gateway: RunningGateway, apns: FakeApns, name: str
) -> None:
    apns.script("topicdisallowed", ApnsReply(400, "TopicDisallowed"))
    dead, live = raw(name), raw("ok")
    response = await gateway.notify(event_id_only(dead, live, event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": [dead["pushkey"]]})


async def test_hex_token_rejected_is_answered_as_the_base64_pushkey(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    token = b"\xfe" * 32
    apns.script(token.hex(), ApnsReply(410, "Unregistered"))
    pushkey = b64(token)
    response = await gateway.notify(event_id_only(device(IOS, pushkey), event_id=event()))
    assert response.json() == {"rejected": [pushkey]}


async def test_pushkeys_and_pusher_data_that_cannot_work_are_rejected(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    devices = [
        device(IOS, "not base64!"),
        device(IOS, "A" * 513),  # over 512 bytes
        device(RAW, "ok.payload", default_payload=["not", "an", "object"]),
        device(RAW, "ok.huge", default_payload={"blob": "x" * 5000}),  # cannot fit in 4096 bytes
        device(IOS, b64(b"\x01" * 32)),
    ]
    response = await gateway.notify(event_id_only(*devices, event_id=event()))
    assert response.status_code == 200
    assert response.json() == {"rejected": ["not base64!", "A" * 513, "ok.payload", "ok.huge"]}
    assert [r.token for r in apns.requests] == ["01" * 32]


async def test_fcm_unregistered_rejects_and_sender_mismatch_is_502(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    response = await gateway.notify(event_id_only(device(ANDROID, "gone.1"), event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": ["gone.1"]})
    response = await gateway.notify(event_id_only(device(ANDROID, "mismatch.1"), event_id=event()))
    assert response.status_code == 502
    assert response.json()["errcode"] == "M_UNKNOWN"


@pytest.mark.parametrize(
    "reply",
    [
        FcmReply(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"),  # FCM's sender id mismatch
        FcmReply(403),  # no FCM error code, status UNKNOWN
        FcmReply(403, "UNAVAILABLE"),  # a status that alone would be retried
    ],
    ids=["sender-id-mismatch", "no-code", "transient-status"],
)
async def test_an_fcm_403_is_502_at_once_whatever_its_body(
    gateway: RunningGateway, fcm: FakeFcm, reply: FcmReply
) -> None:
    # As Sygnal: a dispatch error, so the homeserver keeps the pusher and tries later. Never retried
    # here: a retry that went through would answer 200 for a push FCM refused.
    fcm.script("refused", reply, FcmReply(200))
    response = await gateway.notify(event_id_only(device(ANDROID, "refused.1"), event_id=event()))
    assert (response.status_code, response.json()["errcode"]) == (502, "M_UNKNOWN")
    assert len(fcm.requests) == 1


async def test_a_refusal_that_is_not_the_tokens_is_502(gateway: RunningGateway, apns: FakeApns) -> None:
    response = await gateway.notify(event_id_only(raw("forbidden"), raw("gone"), event_id=event()))
    assert response.status_code == 502  # credentials refused: the homeserver tries again later


async def test_a_transient_failure_is_retried_within_the_request(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    apns.script("flaky", ApnsReply(503, "ServiceUnavailable"), ApnsReply(200))
    pushkey = raw("flaky")
    response = await gateway.notify(event_id_only(pushkey, event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert len(apns.requests_for(pushkey["pushkey"])) == 2


@pytest.mark.slow
async def test_retries_stop_at_the_request_timeout_with_502(gateway: RunningGateway, apns: FakeApns) -> None:
    pushkey = raw("unavailable")
    started = time.monotonic()
    response = await gateway.notify(event_id_only(pushkey, event_id=event()))
    elapsed = time.monotonic() - started
    assert response.status_code == 502
    assert elapsed < 3.0  # the gateway's timeout here
    assert len(apns.requests_for(pushkey["pushkey"])) >= 2  # short retries first


async def test_an_fcm_5xx_without_retry_after_is_retried_at_the_gateways_short_backoff(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    # The gateway's own numbers (its first wait 0.2 s), never a delay of the XMTP pipeline's rules: a
    # wait of seconds would outlive the homeserver's patience and answer 502.
    fcm.script("flaky", FcmReply(503, "UNAVAILABLE", "UNAVAILABLE"), FcmReply(200))
    response = await gateway.notify(event_id_only(device(ANDROID, "flaky.1"), event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    first, second = fcm.requests
    assert 0.2 <= second.received - first.received < 2.0


async def test_an_fcm_retry_after_within_the_budget_is_waited_for(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    fcm.script("later", FcmReply(503, "UNAVAILABLE", "UNAVAILABLE", retry_after="1"), FcmReply(200))
    response = await gateway.notify(event_id_only(device(ANDROID, "later.1"), event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    first, second = fcm.requests
    assert second.received - first.received >= 1.0  # its Retry-After, not the short backoff


async def test_an_fcm_retry_after_past_the_budget_is_502_at_once(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    fcm.script("much-later", FcmReply(503, "UNAVAILABLE", "UNAVAILABLE", retry_after="30"))
    started = time.monotonic()
    response = await gateway.notify(event_id_only(device(ANDROID, "much-later.1"), event_id=event()))
    assert response.status_code == 502
    assert time.monotonic() - started < 1.0
    assert len(fcm.requests) == 1


def quota(retry_after: str | None) -> FcmReply:
    return FcmReply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", retry_after=retry_after)


@pytest.mark.slow
async def test_an_fcm_quota_retry_after_within_the_budget_is_waited_for(
    gateway: RunningGateway, fcm: FakeFcm
) -> None:
    # As Sygnal: its Retry-After, not the channel's pause of at least a minute the XMTP path keeps.
    fcm.script("quota-soon", quota("1"), FcmReply(200))
    response = await gateway.notify(event_id_only(device(ANDROID, "quota-soon.1"), event_id=event()))
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    first, second = fcm.requests
    assert second.received - first.received >= 1.0


@pytest.mark.slow
async def test_fcm_quota_answers_are_tried_three_times_in_all(config_path: str, fcm: FakeFcm) -> None:
    fcm.script("quota-again", quota("1"))  # every answer
    async with running(gateway_settings(config_path, matrix_request_timeout_seconds=10)) as patient:
        response = await patient.notify(event_id_only(device(ANDROID, "quota-again.1"), event_id=event()))
        answered = time.monotonic()
    assert response.status_code == 502
    assert len(fcm.requests) == 3  # as Sygnal's three tries, though the time left allowed more
    first, _, third = fcm.requests
    assert 2.0 <= third.received - first.received < 3.0  # each Retry-After of 1 s waited for
    assert answered - third.received < 1.0  # answered after the third: no wait past it


@pytest.mark.parametrize("retry_after", ["120", "5", None])  # None: 60 s, Sygnal's base
async def test_an_fcm_quota_answer_past_the_budget_is_502_at_once(
    gateway: RunningGateway, fcm: FakeFcm, retry_after: str | None
) -> None:
    fcm.script("quota", quota(retry_after))
    started = time.monotonic()
    response = await gateway.notify(event_id_only(device(ANDROID, "quota.1"), event_id=event()))
    assert response.status_code == 502
    assert time.monotonic() - started < 1.0
    assert len(fcm.requests) == 1


# --------------------------------------------------------------------------- duplicates


async def test_a_delivered_notification_repeated_is_not_sent_again(
    gateway: RunningGateway, apns: FakeApns
) -> None:
    notification = event_id_only(raw("ok"), event_id=event())
    for _ in range(3):
        response = await gateway.notify(notification)
        assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert len(apns.requests) == 1
    # Another event for the same device is sent.
    assert (await gateway.notify({**notification, "event_id": event()})).status_code == 200
    assert len(apns.requests) == 2


async def test_a_failed_notification_repeated_is_sent_again(gateway: RunningGateway, apns: FakeApns) -> None:
    apns.script("later", ApnsReply(403, "InvalidProviderToken"), ApnsReply(200))
    notification = event_id_only(raw("later"), event_id=event())
    assert (await gateway.notify(notification)).status_code == 502
    assert (await gateway.notify(notification)).status_code == 200
    assert (await gateway.notify(notification)).status_code == 200
    assert len(apns.requests) == 2


# --------------------------------------------------------------------------- metrics


async def test_metrics_count_answers_and_devices_without_ids(gateway: RunningGateway, apns: FakeApns) -> None:
    dead = raw("gone")
    await gateway.notify(event_id_only(dead, event_id=event()))
    text = (await gateway.http.get("/metrics")).text
    assert 'xmtp_push_matrix_notifications_total{code="200"}' in text
    assert f'xmtp_push_matrix_devices_total{{app="{RAW}",outcome="rejected"}}' in text
    assert "xmtp_push_matrix_notify_seconds_count" in text
    assert dead["pushkey"] not in text and "example.org" not in text


async def test_gateway_serves_health_and_readiness(gateway: RunningGateway) -> None:
    assert (await gateway.http.get("/healthz")).status_code == 200
    health = await gateway.http.get("/health")  # Sygnal's: its image's HEALTHCHECK asks it
    assert (health.status_code, health.content) == (200, b"")
    assert (await gateway.http.head("/health")).status_code == 200
    ready = await gateway.http.get("/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ok")


async def test_devices_of_one_request_are_sent_concurrently(gateway: RunningGateway, apns: FakeApns) -> None:
    apns.script("pause", ApnsReply(200, delay=0.5))
    devices = [raw("pause") for _ in range(4)]
    started = time.monotonic()
    assert (await gateway.notify(event_id_only(*devices, event_id=event()))).status_code == 200
    assert time.monotonic() - started < 1.5  # not 4 x 0.5 s
