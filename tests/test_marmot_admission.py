"""The Marmot abuse controls' building blocks: two-bucket rate tiers by key, and duplicate memory in
this process and in Redis (two instances sharing one key push once)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from app.marmot.admission import Dedup, RateLimiter, RecentDigests, Tier
from app.queue.redis_link import RedisLink
from tests.support.pipeline import redis_url  # noqa: F401  (fixture)
from tests.support.redis_cluster import ClusterUnderTest


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_minute_bucket_refills_at_its_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(Tier(per_minute=3, per_hour=100), clock=clock)
    assert [limiter.charge(b"k") for _ in range(4)] == [True, True, True, False]
    clock.now += 19.0  # under one token's time (20 s)
    assert not limiter.charge(b"k")
    clock.now += 1.5
    assert limiter.charge(b"k")
    assert not limiter.charge(b"k")


def test_the_hour_bucket_limits_when_the_minute_one_would_not() -> None:
    clock = Clock()
    limiter = RateLimiter(Tier(per_minute=10, per_hour=12), clock=clock)
    assert sum(limiter.charge(b"k") for _ in range(10)) == 10
    clock.now += 60.0
    assert sum(limiter.charge(b"k") for _ in range(10)) == 2  # the hour has two left (and a sliver)
    clock.now += 300.0  # an hour token every 300 s
    assert limiter.charge(b"k")
    assert not limiter.charge(b"k")


def test_keys_are_limited_apart_and_a_refused_charge_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(Tier(per_minute=1, per_hour=2), clock=clock)
    assert limiter.charge(b"a") and limiter.charge(b"b")
    assert not limiter.charge(b"a")
    clock.now += 60.0
    assert limiter.charge(b"a")  # the refused charge did not spend the hour's second token
    clock.now += 60.0
    assert not limiter.charge(b"a")  # the hour's two are spent


def test_the_limiter_forgets_the_least_recent_key_past_its_bound() -> None:
    limiter = RateLimiter(Tier(per_minute=1, per_hour=1), max_keys=2, clock=Clock())
    assert limiter.charge(b"a") and limiter.charge(b"b") and limiter.charge(b"c")
    assert len(limiter._buckets) == 2
    assert limiter.charge(b"a")  # forgotten: a full budget again
    assert not limiter.charge(b"c")


def test_recent_digests_expire_and_are_bounded() -> None:
    clock = Clock()
    recent = RecentDigests(300.0, max_entries=2, clock=clock)
    assert recent.add(b"x") and not recent.add(b"x")
    clock.now += 301.0
    assert not recent.contains(b"x")
    assert recent.add(b"x")
    assert recent.add(b"y") and recent.add(b"z")
    assert recent.add(b"x")  # the oldest was dropped for z


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_two_instances_sharing_redis_act_once(redis: Redis) -> None:
    first, second = Dedup(300.0, redis), Dedup(300.0, redis)
    digest = bytes(range(32))
    assert await first.first_time(digest)
    assert not await second.first_time(digest)
    assert not await first.first_time(digest)
    ttl = await redis.pttl("xmtp-push:marmot:seen:" + digest.hex())
    assert 299_000 < ttl <= 300_000
    assert await second.first_time(bytes(32))


async def test_without_redis_the_memory_decides() -> None:
    dedup = Dedup(300.0)
    assert await dedup.first_time(b"d" * 32)
    assert not await dedup.first_time(b"d" * 32)


async def test_redis_away_falls_back_to_memory() -> None:
    unreachable = Redis.from_url("redis://127.0.0.1:9/0", socket_connect_timeout=0.5)
    try:
        dedup = Dedup(300.0, unreachable)
        assert await dedup.first_time(b"e" * 32)
        assert not await dedup.first_time(b"e" * 32)
    finally:
        await unreachable.aclose()


async def test_two_instances_sharing_a_redis_cluster_act_once(redis_cluster: ClusterUnderTest) -> None:
    redis_cluster.flush()
    links = [RedisLink(redis_cluster.url), RedisLink(redis_cluster.url)]
    try:
        first, second = (Dedup(300.0, link) for link in links)
        digest = bytes(range(1, 33))
        assert await first.first_time(digest)
        assert not await second.first_time(digest)
        assert all(link.cluster for link in links)
        assert await second.first_time(bytes(32))
    finally:
        for link in links:
            await link.close()
