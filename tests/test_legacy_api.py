"""The legacy notifications.v1 API at its edge: the five RPCs over gRPC, Connect JSON and Connect
proto, their answers and errors (docs/legacy.md#answers-and-errors), and what each stores
(docs/legacy.md#what-each-rpc-does)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from sqlalchemy import text

from app.legacy.eligibility import PERIOD_NS
from app.proto.notifications.v1 import service_pb2 as lpb
from tests.support import Api
from tests.support.legacy import (
    SERVICE,
    TRANSPORTS,
    Refused,
    connect,
    group,
    legacy_call,
    register_request,
    stored,
    welcome,
)
from workers.sweeper import sweep_once

MALFORMED = ("invalid_argument", "request is malformed")
NO_ID = ("invalid_argument", "missing installation id")
NO_MECHANISM = ("invalid_argument", "missing delivery mechanism")


@pytest.fixture
async def api(api_with: Callable[..., AbstractAsyncContextManager[Api]]) -> AsyncIterator[Api]:
    delivery_url = "http://127.0.0.1:9/hook"
    async with api_with(
        legacy_api_enabled=True, max_push_topics=3, legacy_http_delivery_url=delivery_url
    ) as started:
        yield started


def refused(reply: object) -> tuple[str, str]:
    assert isinstance(reply, Refused), reply
    return reply.code, reply.message


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_register_answers_the_id_and_when_it_expires(api: Api, transport: str) -> None:
    before = time.time()
    reply = await legacy_call(api, transport, register_request("install-1"))
    assert isinstance(reply, lpb.RegisterInstallationResponse)
    assert reply.installation_id == "install-1"
    ttl_ms = api.runtime.settings.legacy_installation_ttl_seconds * 1000
    assert before * 1000 + ttl_ms - 1000 <= reply.valid_until <= time.time() * 1000 + ttl_ms
    rows = (await stored(api))["installations"]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [("install-1", 1, "a" * 64, False)]


async def test_json_takes_either_naming_and_answers_uint64_as_a_string(api: Api) -> None:
    for body in (
        {"installationId": "i1", "deliveryMechanism": {"firebaseDeviceToken": "tok"}},
        {"installation_id": "i2", "delivery_mechanism": {"custom_token": "tok"}, "unknown_field": 1},
    ):
        response = await api.http.post(
            f"/{SERVICE}/RegisterInstallation", json=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 200, response.text
        document = response.json()
        assert document["installationId"] == body.get("installationId", body.get("installation_id"))
        assert isinstance(document["validUntil"], str) and document["validUntil"].isdigit()
    kinds = {r[0]: r[1] for r in (await stored(api))["installations"]}
    assert kinds == {"i1": 2, "i2": 3}


async def test_empty_answers_are_empty_json_and_zero_bytes(api: Api) -> None:
    body = json.dumps({"installationId": "i1", "topics": [group(1)]}).encode()
    response = await api.http.post(
        f"/{SERVICE}/Subscribe", content=body, headers={"content-type": "application/json"}
    )
    assert (response.status_code, response.text) == (200, "{}")
    proto = lpb.SubscribeRequest(installation_id="i1", topics=[group(2)]).SerializeToString()
    response = await api.http.post(
        f"/{SERVICE}/Subscribe", content=proto, headers={"content-type": "application/proto"}
    )
    assert (response.status_code, response.content) == (200, b"")


async def test_a_gzip_body_is_taken_and_a_bomb_is_refused(api: Api) -> None:
    request = register_request("zipped").SerializeToString()
    reply = await connect(
        api, "RegisterInstallation", gzip.compress(request), "application/proto", {"content-encoding": "gzip"}
    )
    assert isinstance(reply, lpb.RegisterInstallationResponse) and reply.installation_id == "zipped"
    bomb = gzip.compress(b"\x0a" + b"\x00" * (8 * 1024 * 1024))
    reply = await connect(
        api, "RegisterInstallation", bomb, "application/proto", {"content-encoding": "gzip"}
    )
    assert isinstance(reply, Refused) and (reply.code, reply.status) == ("resource_exhausted", 429)
    reply = await connect(
        api, "RegisterInstallation", request, "application/proto", {"content-encoding": "br"}
    )
    assert isinstance(reply, Refused) and reply.code == "unimplemented"


async def test_the_edges_of_the_routes(api: Api) -> None:
    response = await api.http.get(f"/{SERVICE}/Subscribe")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    response = await api.http.post(
        f"/{SERVICE}/Subscribe", content=b"x", headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.headers["accept-post"] == "application/json, application/proto"
    response = await api.http.post(
        f"/{SERVICE}/Nothing", content=b"{}", headers={"content-type": "application/json"}
    )
    assert response.status_code == 404


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_checks_in_their_order_change_nothing(api: Api, transport: str) -> None:
    await legacy_call(api, transport, register_request("kept"))
    await legacy_call(api, transport, lpb.SubscribeRequest(installation_id="kept", topics=[group(1)]))
    before = await stored(api)
    cases: list[tuple[Any, tuple[str, str]]] = [
        (register_request(""), NO_ID),
        (register_request("x" * 257), NO_ID),
        (register_request("", apns_device_token=""), NO_ID),  # the id is checked first
        (lpb.RegisterInstallationRequest(installation_id="i"), NO_MECHANISM),
        (register_request("i", apns_device_token=""), NO_MECHANISM),
        (register_request("i", apns_device_token="t" * 4097), MALFORMED),
        (register_request("i", firebase_device_token="t\x00"), MALFORMED),
        (lpb.SubscribeRequest(installation_id="kept", topics=[group(2), "t" * 257]), MALFORMED),
        (lpb.SubscribeRequest(installation_id="", topics=["t" * 257]), NO_ID),
        (lpb.SubscribeRequest(installation_id="kept", topics_bytes=[b"\x00" + b"\x01" * 15]), MALFORMED),
        (lpb.UnsubscribeRequest(installation_id="kept", topics=[group(1), "t" * 257]), MALFORMED),
        (lpb.DeleteInstallationRequest(installation_id=""), NO_ID),
        (_with_keys("kept", group(2), {5: b""}), MALFORMED),
        (_with_keys("kept", group(2), {5: b"k" * 65}), MALFORMED),
        (
            lpb.SubscribeRequest(installation_id="kept", topics=[group(2), group(3), group(4)]),
            ("resource_exhausted", "installation topic limit reached"),
        ),
    ]
    for request, expected in cases:
        assert refused(await legacy_call(api, transport, request)) == expected, request
    assert await stored(api) == before


async def test_bad_bodies_are_malformed_on_every_transport(api: Api) -> None:
    for content_type, body in (
        ("application/json", b"{"),
        ("application/json", b'{"installationId": 5}'),
        ("application/proto", b"\xff\xff\xff"),
    ):
        reply = await connect(api, "RegisterInstallation", body, content_type)
        assert isinstance(reply, Refused) and (reply.code, reply.message, reply.status) == (*MALFORMED, 400)
    rpc = api.grpc_channel.unary_unary(
        f"/{SERVICE}/Subscribe", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    import grpc

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rpc(b"\xff\xff\xff", timeout=30)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, MALFORMED[1])


async def test_a_channel_not_configured_is_refused_and_told_once(
    api_with: Callable[..., AbstractAsyncContextManager[Api]], caplog: pytest.LogCaptureFixture
) -> None:
    async with api_with(legacy_api_enabled=True) as api:
        for transport in TRANSPORTS:
            reply = await legacy_call(api, transport, register_request("i", custom_token="c"))
            assert refused(reply) == ("failed_precondition", "channel is not configured")
        assert (await stored(api))["installations"] == []
    told = [
        r.getMessage() for r in caplog.records if "RegisterInstallation asked for channel" in r.getMessage()
    ]
    assert told == [
        "RegisterInstallation asked for channel custom, which is not configured: "
        "it needs XMTP_PUSH_LEGACY_HTTP_DELIVERY_URL"
    ]


async def test_the_http_delivery_takes_every_kind(
    api_with: Callable[..., AbstractAsyncContextManager[Api]],
) -> None:
    async with api_with(
        legacy_api_enabled=True,
        apns_key=None,
        fcm_service_account=None,
        legacy_http_delivery_url="http://127.0.0.1:9/hook",
    ) as api:
        for n, token in enumerate(
            ({"apns_device_token": "a"}, {"firebase_device_token": "f"}, {"custom_token": "c"})
        ):
            assert isinstance(
                await legacy_call(api, "json", register_request(f"i{n}", **token)),
                lpb.RegisterInstallationResponse,
            )


async def test_disabled_it_is_not_served(api_with: Callable[..., AbstractAsyncContextManager[Api]]) -> None:
    async with api_with() as api:
        reply = await connect(api, "Subscribe", b"{}", "application/json")
        assert isinstance(reply, Refused) and reply.status == 404
        assert (
            refused(await legacy_call(api, "grpc", lpb.SubscribeRequest(installation_id="i")))[0]
            == "unimplemented"
        )


async def test_subscribe_collapses_repeats_and_keeps_what_it_does_not_name(api: Api) -> None:
    await legacy_call(api, "proto", _with_keys("i", group(1), {670: b"a" * 42, 671: b"b" * 42}, silent=True))
    # Subscribe keeps silence and keys; duplicates (as React Native Android sends them) count once.
    await legacy_call(
        api, "proto", lpb.SubscribeRequest(installation_id="i", topics=[group(1), group(1), group(2)])
    )
    rows = await stored(api)
    assert [(r[1], r[2], r[3]) for r in rows["subscriptions"]] == [
        (group(1), True, True),
        (group(2), True, False),
    ]
    assert [(r[2], r[3]) for r in rows["keys"]] == [(670, b"a" * 42), (671, b"b" * 42)]


async def test_subscribe_with_metadata_last_one_wins_and_other_periods_stay(api: Api) -> None:
    await legacy_call(api, "proto", _with_keys("i", group(1), {670: b"a" * 42, 671: b"b" * 42}))
    request = lpb.SubscribeWithMetadataRequest(
        installation_id="i",
        subscriptions=[
            _subscription(group(1), {671: b"x" * 42}, silent=False),
            _subscription(group(1), {671: b"y" * 42, 672: b"z" * 42}, silent=True),
        ],
    )
    request.subscriptions[1].hmac_keys.append(
        lpb.Subscription.HmacKey(thirty_day_periods_since_epoch=672, key=b"w" * 42)
    )
    assert isinstance(
        await legacy_call(api, "json", request), type(lpb.RegisterInstallationResponse()).__mro__[1]
    )
    rows = await stored(api)
    assert [(r[1], r[3]) for r in rows["subscriptions"]] == [(group(1), True)]
    assert [(r[2], r[3]) for r in rows["keys"]] == [(670, b"a" * 42), (671, b"y" * 42), (672, b"w" * 42)]


async def test_a_subscription_keeps_the_keys_of_the_periods_nearest_now(api: Api) -> None:
    now = time.time_ns() // PERIOD_NS
    # Two calls, ten periods each, long past and ahead: each call's body is bounded, their sum would not be.
    await legacy_call(api, "proto", _with_keys("i", group(1), {now - d: b"p" * 42 for d in range(6, 16)}))
    await legacy_call(api, "proto", _with_keys("i", group(1), {now + d: b"f" * 42 for d in range(1, 11)}))
    await legacy_call(api, "proto", _with_keys("i", group(2), {now: b"n" * 42}))  # another subscription's
    rows = await stored(api)
    kept = sorted((r[1], r[2] - now) for r in rows["keys"])
    # The eight nearest now, the later of two as near: +1 to +6, -6, +7.
    assert kept == sorted([(group(1), d) for d in (1, 2, 3, 4, 5, 6, -6, 7)] + [(group(2), 0)])


async def test_binary_topics_name_the_same_subscriptions(api: Api) -> None:
    binary = b"\x00" + (1).to_bytes(16, "big")
    await legacy_call(
        api, "grpc", lpb.SubscribeRequest(installation_id="i", topics=[group(1)], topics_bytes=[binary])
    )
    await legacy_call(
        api,
        "grpc",
        lpb.SubscribeWithMetadataRequest(
            installation_id="i",
            subscriptions=[
                lpb.Subscription(topic="ignored", topic_bytes=b"\x01" + b"\x02" * 32, is_silent=True)
            ],
        ),
    )
    rows = (await stored(api))["subscriptions"]
    assert [(r[1], r[3]) for r in rows] == [
        (group(1), False),
        (welcome(int.from_bytes(b"\x02" * 32, "big")), True),
    ]
    await legacy_call(api, "json", lpb.UnsubscribeRequest(installation_id="i", topics_bytes=[binary]))
    assert [r[2] for r in (await stored(api))["subscriptions"]] == [False, True]


async def test_unsubscribe_delete_and_register_again(api: Api) -> None:
    await legacy_call(api, "json", register_request("i"))
    await legacy_call(api, "json", lpb.SubscribeRequest(installation_id="i", topics=[group(1), group(2)]))
    await legacy_call(api, "json", lpb.UnsubscribeRequest(installation_id="i", topics=[group(2), group(9)]))
    await legacy_call(api, "json", lpb.DeleteInstallationRequest(installation_id="i"))
    await legacy_call(api, "json", lpb.DeleteInstallationRequest(installation_id="never-seen"))
    rows = await stored(api)
    assert [r[4] for r in rows["installations"]] == [True]
    assert [(r[1], r[2]) for r in rows["subscriptions"]] == [(group(1), True), (group(2), False)]
    await legacy_call(api, "json", register_request("i", firebase_device_token="new"))
    rows = await stored(api)
    assert [(r[1], r[2], r[4]) for r in rows["installations"]] == [(2, "new", False)]
    assert len(rows["subscriptions"]) == 2  # old subscriptions fire again


async def test_an_expired_installation_starts_afresh(api: Api) -> None:
    await legacy_call(api, "json", register_request("i"))
    await legacy_call(api, "json", lpb.SubscribeRequest(installation_id="i", topics=[group(1)]))
    # A TTL passes: what was stored is moved that far into the past.
    ago = api.runtime.legacy_rules.ttl_ns + 1_000_000_000
    async with api.runtime.engine.begin() as connection:
        await connection.execute(
            text(f"UPDATE legacy_installations SET registered_ns = registered_ns - {ago}")
        )
        await connection.execute(text(f"UPDATE legacy_subscriptions SET created_ns = created_ns - {ago}"))
    await legacy_call(
        api, "json", lpb.SubscribeRequest(installation_id="i", topics=[group(2)])
    )  # after expiry
    await legacy_call(api, "json", register_request("i"))
    assert [r[1] for r in (await stored(api))["subscriptions"]] == [group(2)]


def _subscription(topic: str, keys: dict[int, bytes], silent: bool = False) -> lpb.Subscription:
    return lpb.Subscription(
        topic=topic,
        is_silent=silent,
        hmac_keys=[
            lpb.Subscription.HmacKey(thirty_day_periods_since_epoch=p, key=k) for p, k in keys.items()
        ],
    )


def _with_keys(
    installation_id: str, topic: str, keys: dict[int, bytes], silent: bool = False
) -> lpb.SubscribeWithMetadataRequest:
    return lpb.SubscribeWithMetadataRequest(
        installation_id=installation_id, subscriptions=[_subscription(topic, keys, silent)]
    )


async def test_the_sweep_deletes_expired_installations_and_old_unregistered_subscriptions(api: Api) -> None:
    await legacy_call(api, "json", register_request("stale"))
    await legacy_call(
        api,
        "json",
        lpb.SubscribeWithMetadataRequest(
            installation_id="stale",
            subscriptions=[
                lpb.Subscription(
                    topic=group(1),
                    hmac_keys=[lpb.Subscription.HmacKey(thirty_day_periods_since_epoch=1, key=b"k")],
                )
            ],
        ),
    )
    await legacy_call(
        api, "json", lpb.SubscribeRequest(installation_id="never-registered", topics=[group(2)])
    )
    await legacy_call(api, "json", register_request("fresh"))
    await legacy_call(api, "json", lpb.SubscribeRequest(installation_id="fresh", topics=[group(3)]))
    ago = api.runtime.legacy_rules.ttl_ns + 1_000_000_000
    async with api.runtime.engine.begin() as connection:
        for statement in (
            f"UPDATE legacy_installations SET registered_ns = registered_ns - {ago} WHERE id = 'stale'",
            f"UPDATE legacy_subscriptions SET created_ns = created_ns - {ago} WHERE installation_id <> 'fresh'",
        ):
            await connection.execute(text(statement))
    await sweep_once(api.runtime)
    rows = await stored(api)
    assert [r[0] for r in rows["installations"]] == ["fresh"]
    assert [(r[0], r[1]) for r in rows["subscriptions"]] == [("fresh", group(3))]
    assert rows["keys"] == []
