"""Concurrent requests for one recipient on PostgreSQL (the production database):
topic_count must stay exactly the number of stored subscriptions, and a new id
raced under different secrets must end up owned by exactly one of them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from google.protobuf.message import Message

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from tests.support import Api, make_settings, running
from tests.support.builders import (
    BAD_SECRET,
    NOT_REGISTERED,
    Creds,
    Failure,
    call,
    fcm,
    group_topic,
    hmac_key,
    new_creds,
    recipient_row,
    register,
    seeded,
    sha256,
    sub,
    subscription_rows,
    unregister,
    update,
    welcome_topic,
)

ROUNDS = 4
CONCURRENT = 24


@pytest.fixture
async def pg_api(postgresql_url: str) -> AsyncIterator[Api]:
    async with running(make_settings(postgresql_url)) as api:
        yield api


def random_update(rng: random.Random, creds: Creds, pool: list[bytes]) -> pb.UpdateSubscriptionsRequest:
    """Adds and removes drawn from a small shared pool, so concurrent requests overlap."""
    chosen = rng.sample(pool, rng.randint(1, 10))
    split = rng.randint(0, len(chosen))
    adds = [
        sub(t, base=rng.randint(0, 5), keys=(hmac_key(rng.randint(0, 255)),) * rng.randint(0, 3))
        for t in chosen[:split]
    ]
    return update(creds, adds, chosen[split:])


async def assert_count_exact(api: Api, creds: Creds) -> int:
    rows = await subscription_rows(api, creds.rid)
    stored = await recipient_row(api, creds.rid)
    assert stored is not None
    assert stored.topic_count == len(rows)
    state = await api.stub.UpdateSubscriptions(update(creds))
    assert state.topic_count == len(rows)
    return len(rows)


async def test_concurrent_updates_keep_topic_count_exact(pg_api: Api) -> None:
    api, rng = pg_api, random.Random(20240601)
    first, _ = await seeded(api, topics=0)
    second, _ = await seeded(api, topics=0)
    pool = [group_topic() for _ in range(12)] + [welcome_topic() for _ in range(4)]
    counts = set()
    for _ in range(ROUNDS):
        requests = [random_update(rng, rng.choice((first, second)), pool) for _ in range(CONCURRENT)]
        calls = [api.stub.UpdateSubscriptions(r) for r in requests]
        calls += [api.stub.Register(register(first, fcm("renewed"))) for _ in range(3)]  # re-registers too
        replies = await asyncio.gather(*calls)
        assert all(0 <= reply.topic_count <= len(pool) for reply in replies)
        counts.add(await assert_count_exact(api, first))
        counts.add(await assert_count_exact(api, second))
    assert counts != {0}  # the race really stored subscriptions


async def test_concurrent_register_of_a_new_id_has_one_owner(pg_api: Api) -> None:
    for contenders in (2, 2, 2, 2, 2, 5):
        rid = new_creds().rid
        claims = [Creds(rid, new_creds().secret) for _ in range(contenders)]
        # gRPC and Connect at once: both transports share the one rule
        transports = [("grpc", "json")[i % 2] for i in range(contenders)]
        replies = await asyncio.gather(
            *(
                call(api=pg_api, transport=t, request=register(c))
                for t, c in zip(transports, claims, strict=True)
            )
        )
        winners = [c for c, reply in zip(claims, replies, strict=True) if not isinstance(reply, Failure)]
        losers = [reply for reply in replies if isinstance(reply, Failure)]
        assert len(winners) == 1
        assert losers == [Failure("permission_denied", BAD_SECRET)] * (contenders - 1)
        row = await recipient_row(pg_api, rid)
        assert row is not None and row.secret_hash == sha256(winners[0].secret)
        assert (
            await pg_api.stub.UpdateSubscriptions(update(winners[0], [sub(group_topic())]))
        ).topic_count == 1
        for loser in (c for c in claims if c is not winners[0]):
            assert await call(pg_api, "grpc", update(loser)) == Failure("permission_denied", BAD_SECRET)


async def test_concurrent_register_with_the_same_secret_both_succeed(pg_api: Api) -> None:
    for _ in range(5):
        creds = new_creds()
        replies = await asyncio.gather(*(call(pg_api, t, register(creds)) for t in ("grpc", "json", "grpc")))
        assert all(not isinstance(reply, Failure) and reply.topic_count == 0 for reply in replies)
        row = await recipient_row(pg_api, creds.rid)
        assert row is not None and row.secret_hash == sha256(creds.secret)


async def test_unregister_racing_updates_leaves_nothing_behind(pg_api: Api) -> None:
    rng = random.Random(7)
    for _ in range(3):
        creds, _ = await seeded(pg_api, topics=5)
        pool = [group_topic() for _ in range(10)]
        requests: list[Message] = [random_update(rng, creds, pool) for _ in range(12)]
        requests.insert(6, unregister(creds))
        replies = await asyncio.gather(*(call(pg_api, "grpc", r) for r in requests))
        assert all(not isinstance(r, Failure) or r == Failure("not_found", NOT_REGISTERED) for r in replies)
        assert not isinstance(replies[6], Failure)
        assert await recipient_row(pg_api, creds.rid) is None
        assert await subscription_rows(pg_api, creds.rid) == {}
