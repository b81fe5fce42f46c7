"""State semantics of the notification API (docs/recipients.md#state-semantics),
checked against the stored rows, over gRPC and Connect."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.recipients.models import Recipient, Subscription
from app.runtime import Runtime
from tests.support import Api
from tests.support.builders import (
    ALL_TRANSPORTS,
    NOT_REGISTERED,
    SERVICE,
    TRANSPORTS,
    TTL_DEFAULT_NS,
    Creds,
    adds_of,
    apns,
    b64,
    fcm,
    group_topic,
    hmac_key,
    http,
    new_creds,
    ok,
    recipient_row,
    refused,
    register,
    seeded,
    sha256,
    snapshot,
    sub,
    subscription_rows,
    unregister,
    update,
    welcome_topic,
)
from workers.sweeper import sweep_once

ApiWith = Callable[..., AbstractAsyncContextManager[Api]]
SECOND_NS = 1_000_000_000
# Wall clock between the test and the server; both read time.time_ns() on this host.
TOLERANCE_NS = 5 * SECOND_NS


async def stored(api: Api, rid: bytes) -> Recipient:
    row = await recipient_row(api, rid)
    assert row is not None
    return row


async def test_register_creates_with_zero_topics(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds = new_creds()
        started = time.time_ns()
        state = await ok(api, transport, register(creds, fcm("device-token")))
        assert (state.topic_count, state.channel) == (0, pb.CHANNEL_FCM), transport
        row = await stored(api, creds.rid)
        assert row.secret_hash == sha256(creds.secret) != creds.secret
        assert (row.channel, row.target, row.signing_key, row.topic_count) == (2, "device-token", None, 0)
        assert started <= row.created_ns == row.renewed_ns <= time.time_ns()
        assert state.expires_at_ns == row.renewed_ns + TTL_DEFAULT_NS
        assert await subscription_rows(api, creds.rid) == {}


async def test_register_stores_each_channel_and_its_target(api: Api) -> None:
    key = bytes(range(40))
    cases = [
        (apns("apns-token"), pb.CHANNEL_APNS, "apns-token", None),
        (fcm("fcm-token"), pb.CHANNEL_FCM, "fcm-token", None),
        (http("https://127.0.0.1:9443/h", key), pb.CHANNEL_HTTP, "https://127.0.0.1:9443/h", key),
    ]
    for delivery, channel, target, signing_key in cases:
        creds = new_creds()
        assert (await ok(api, "grpc", register(creds, delivery))).channel == channel
        row = await stored(api, creds.rid)
        assert (row.channel, row.target, row.signing_key) == (channel, target, signing_key)


async def test_reregister_replaces_channel_and_keeps_subscriptions(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds, _ = await seeded(api, topics=2, delivery=fcm("old-token"))
        first = await stored(api, creds.rid)
        subscriptions = await subscription_rows(api, creds.rid)
        await asyncio.sleep(0.002)
        key = b"n" * 20
        state = await ok(api, transport, register(creds, http("https://127.0.0.1/new", key)))
        assert (state.topic_count, state.channel) == (2, pb.CHANNEL_HTTP), transport
        row = await stored(api, creds.rid)
        assert (row.channel, row.target, row.signing_key, row.topic_count) == (
            3,
            "https://127.0.0.1/new",
            key,
            2,
        )
        assert (row.secret_hash, row.created_ns) == (first.secret_hash, first.created_ns)
        assert row.renewed_ns > first.renewed_ns
        assert state.expires_at_ns == row.renewed_ns + TTL_DEFAULT_NS
        assert _sub_values(await subscription_rows(api, creds.rid)) == _sub_values(subscriptions)
        # switching away from the webhook drops the key that only it needed
        state = await ok(api, transport, register(creds, apns("apns-token")))
        assert (state.topic_count, state.channel) == (2, pb.CHANNEL_APNS)
        row = await stored(api, creds.rid)
        assert (row.channel, row.target, row.signing_key, row.topic_count) == (1, "apns-token", None, 2)


def _sub_values(rows: dict[bytes, Subscription]) -> dict[bytes, tuple[object, ...]]:
    return {t: (r.start_ns, r.hmac_epoch_base, r.hmac_keys, r.include_commits) for t, r in rows.items()}


async def test_expires_at_is_renewed_plus_ttl(api_with: ApiWith) -> None:
    ttl_ns = 86_400 * SECOND_NS
    async with api_with(recipient_ttl_seconds=86_400) as api:
        for transport in ALL_TRANSPORTS:
            creds = new_creds()
            state = await ok(api, transport, register(creds))
            row = await stored(api, creds.rid)
            assert state.expires_at_ns == row.renewed_ns + ttl_ns, transport
            assert abs(state.expires_at_ns - (time.time_ns() + ttl_ns)) < TOLERANCE_NS
            state = await ok(api, transport, update(creds, adds_of(group_topic())))
            row = await stored(api, creds.rid)
            assert state.expires_at_ns == row.renewed_ns + ttl_ns, transport


async def test_update_subscriptions_renews(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds, _ = await seeded(api, topics=1)
        before = await stored(api, creds.rid)
        await asyncio.sleep(0.002)
        started = time.time_ns()
        state = await ok(api, transport, update(creds))  # no adds, no removes: still a renewal
        row = await stored(api, creds.rid)
        assert started <= row.renewed_ns <= time.time_ns(), transport
        assert row.renewed_ns > before.renewed_ns and row.created_ns == before.created_ns
        assert (state.topic_count, state.channel, row.topic_count) == (1, pb.CHANNEL_FCM, 1)
        assert state.expires_at_ns == row.renewed_ns + TTL_DEFAULT_NS


async def test_readd_replaces_key_window_and_keeps_start(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds, _ = await seeded(api, topics=0)
        topic = welcome_topic()
        started = time.time_ns()
        await ok(api, transport, update(creds, [sub(topic, base=5, keys=(hmac_key(1), hmac_key(2)))]))
        first = (await subscription_rows(api, creds.rid))[topic]
        assert started <= first.start_ns <= time.time_ns()
        assert (first.hmac_epoch_base, first.hmac_keys, first.include_commits) == (
            5,
            hmac_key(1) + hmac_key(2),
            False,
        )
        await asyncio.sleep(0.002)
        keys = (hmac_key(3), hmac_key(4), hmac_key(5))
        state = await ok(api, transport, update(creds, [sub(topic, base=7, keys=keys, commits=True)]))
        assert state.topic_count == 1, transport
        row = (await subscription_rows(api, creds.rid))[topic]
        assert (row.start_ns, row.hmac_epoch_base, row.hmac_keys, row.include_commits) == (
            first.start_ns,
            7,
            b"".join(keys),
            True,
        )
        # re-added without keys: the window is cleared, the start position still kept
        state = await ok(api, transport, update(creds, [sub(topic, base=9)]))
        row = (await subscription_rows(api, creds.rid))[topic]
        assert (row.start_ns, row.hmac_epoch_base, row.hmac_keys, row.include_commits) == (
            first.start_ns,
            None,
            None,
            False,
        )
        assert state.topic_count == 1 and (await stored(api, creds.rid)).topic_count == 1


async def test_epoch_base_stored_only_with_keys(api: Api) -> None:
    for transport in TRANSPORTS:
        creds, _ = await seeded(api, topics=0)
        without, zero_base, with_keys = group_topic(), group_topic(), welcome_topic()
        adds = [
            sub(without, base=9),
            sub(zero_base, base=0, keys=(hmac_key(),)),
            sub(with_keys, base=12, keys=(hmac_key(),)),
        ]
        await ok(api, transport, update(creds, adds))
        rows = await subscription_rows(api, creds.rid)
        assert (rows[without].hmac_epoch_base, rows[without].hmac_keys) == (None, None), transport
        assert (rows[zero_base].hmac_epoch_base, rows[zero_base].hmac_keys) == (0, hmac_key())
        assert (rows[with_keys].hmac_epoch_base, rows[with_keys].hmac_keys) == (12, hmac_key())


async def test_removes(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds, topics = await seeded(api, topics=3)
        other, _ = await seeded(api, topics=1)
        before = await snapshot(api)
        state = await ok(api, transport, update(creds, [], [group_topic(), welcome_topic()]))
        assert state.topic_count == 3, transport  # absent topics: a no-op
        assert (await snapshot(api)).subscriptions == before.subscriptions
        state = await ok(api, transport, update(creds, adds_of(group_topic()), [topics[0], group_topic()]))
        rows = await subscription_rows(api, creds.rid)
        assert state.topic_count == 3 == len(rows) == (await stored(api, creds.rid)).topic_count
        assert topics[0] not in rows and {topics[1], topics[2]} <= set(rows)
        assert len(await subscription_rows(api, other.rid)) == 1


async def test_unregister_cascades(api: Api) -> None:
    for transport in ALL_TRANSPORTS:
        creds, _ = await seeded(api, topics=3)
        other, _ = await seeded(api, topics=2)
        kept = await snapshot(api)
        assert await ok(api, transport, unregister(creds)) == pb.UnregisterResponse()
        assert await recipient_row(api, creds.rid) is None
        assert await subscription_rows(api, creds.rid) == {}
        after = await snapshot(api)
        assert [r for r in after.recipients if r[0] != creds.rid] == [
            r for r in kept.recipients if r[0] != creds.rid
        ]
        assert len(await subscription_rows(api, other.rid)) == 2
        for request in (unregister(creds), update(creds, adds_of(group_topic()))):
            await refused(api, request, "not_found", NOT_REGISTERED, (transport,))
        # the id is free again: another secret may take it, starting from zero topics
        again = Creds(creds.rid, new_creds().secret)
        assert (await ok(api, transport, register(again))).topic_count == 0


async def test_thousand_adds_in_one_request(api: Api) -> None:
    keys = (hmac_key(1), hmac_key(2), hmac_key(3))
    for transport in TRANSPORTS:
        creds, _ = await seeded(api, topics=0)
        topics = [group_topic() if i % 2 else welcome_topic() for i in range(1000)]
        state = await ok(
            api, transport, update(creds, [sub(t, base=i, keys=keys) for i, t in enumerate(topics)])
        )
        rows = await subscription_rows(api, creds.rid)
        assert state.topic_count == 1000 == len(rows) == (await stored(api, creds.rid)).topic_count, transport
        assert rows[topics[999]].hmac_epoch_base == 999 and rows[topics[999]].hmac_keys == b"".join(keys)
        # 500 removes and 500 adds in one request
        fresh = [group_topic() for _ in range(500)]
        state = await ok(api, transport, update(creds, adds_of(*fresh), topics[:500]))
        rows = await subscription_rows(api, creds.rid)
        assert state.topic_count == 1000 == len(rows)
        assert set(rows) == set(topics[500:]) | set(fresh)


async def test_connect_json_wire_format(api: Api) -> None:
    """Hand-written proto3 JSON in, and int64/uint64 as strings, enums by name out."""
    creds = new_creds()
    path = f"/{SERVICE}/Register"
    body: dict[str, Any] = {
        "recipientId": b64(creds.rid),
        "recipientSecret": b64(creds.secret),
        "fcm": {"token": "t"},
    }
    response = await api.http.post(path, json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    document = response.json()
    assert document["channel"] == "CHANNEL_FCM"
    assert isinstance(document["expiresAtNs"], str) and int(document["expiresAtNs"]) > time.time_ns()
    assert document.get("topicCount", "0") == "0"
    topic = group_topic()
    body = {
        "recipient_id": b64(creds.rid).replace("+", "-").replace("/", "_").rstrip("="),  # url-safe, unpadded
        "recipientSecret": b64(creds.secret),
        "adds": [
            {"topic": b64(topic), "hmacEpochBase": "3", "hmacKeys": [b64(hmac_key())], "includeCommits": True}
        ],
    }
    response = await api.http.post(
        f"/{SERVICE}/UpdateSubscriptions",
        content=json.dumps(body),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["topicCount"] == "1"
    row = (await subscription_rows(api, creds.rid))[topic]
    assert (row.hmac_epoch_base, row.hmac_keys, row.include_commits) == (3, hmac_key(), True)
    response = await api.http.post(
        f"/{SERVICE}/Unregister", json={"recipientId": b64(creds.rid), "recipientSecret": b64(creds.secret)}
    )
    assert (response.status_code, response.json()) == (200, {})


# --- expiry ---------------------------------------------------------------------------


def at_time(api: Api, now_ns: int) -> Runtime:
    """The API's runtime with its rules' clock fixed at now_ns."""
    runtime = api.runtime
    return dataclasses.replace(runtime, rules=dataclasses.replace(runtime.rules, clock=lambda: now_ns))


async def test_sweep_deletes_expired_recipients_only(api: Api) -> None:
    stale, _ = await seeded(api, topics=3)
    fresh, fresh_topics = await seeded(api, topics=2)
    await asyncio.sleep(0.002)
    await ok(api, "grpc", update(fresh))  # the renewal keeps it alive
    stale_renewed = (await stored(api, stale.rid)).renewed_ns
    fresh_renewed = (await stored(api, fresh.rid)).renewed_ns
    assert fresh_renewed > stale_renewed + 1
    # a moment when the stale one has gone a TTL without renewal and the fresh one has not
    now = (stale_renewed + fresh_renewed) // 2 + TTL_DEFAULT_NS
    assert await sweep_once(at_time(api, now)) == 1
    assert await recipient_row(api, stale.rid) is None
    assert await subscription_rows(api, stale.rid) == {}
    assert set(await subscription_rows(api, fresh.rid)) == set(fresh_topics)
    assert (await stored(api, fresh.rid)).topic_count == 2
    await refused(api, update(stale, adds_of(group_topic())), "not_found", NOT_REGISTERED, ALL_TRANSPORTS)
    assert (await ok(api, "json", update(fresh, adds_of(group_topic())))).topic_count == 3
    # nothing left to sweep at the real time
    assert await sweep_once(api.runtime) == 0


async def test_sweep_takes_every_batch(api: Api) -> None:
    async with api.runtime.sessions() as session, session.begin():
        session.add_all(
            Recipient(
                id=i.to_bytes(32, "big"),
                secret_hash=b"h" * 32,
                channel=2,
                target="t",
                topic_count=0,
                created_ns=1_000,
                renewed_ns=1_000 + i,
            )
            for i in range(1_234)
        )
    survivor, _ = await seeded(api, topics=1)
    assert await sweep_once(at_time(api, time.time_ns() + TTL_DEFAULT_NS - 60 * SECOND_NS)) == 1_234
    remaining = await snapshot(api)
    assert [row[0] for row in remaining.recipients] == [survivor.rid]
    assert len(remaining.subscriptions) == 1
