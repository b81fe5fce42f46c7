"""Two Marmot servers with one key and one Redis, in this test process, each as `xmtp-push marmot`
assembles it (its own providers, Redis client and handlers), reading the same relay: each gift wrap is
unwrapped by one of them, and the limits and the duplicate memory hold across both as for one.

(The servers share this process's metrics registry, so the counts below are both servers' together;
tests/test_marmot_processes.py runs them as separate processes.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster

from app.marmot.giftwrap import wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.shared_limits import SharedKeys
from app.marmot.tokens import Platform, encrypt_token
from app.marmot.wrap_queue import GROUP
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support import eventually, frozen_heap
from tests.support.marmot import (  # noqa: F401  (fixtures)
    RAISED_RATE_LIMIT,
    b64,
    fakes,
    gift_wrap,
    key,
    marmot_settings,
    running_relay,
    serving,
    settle,
    tokens,
    triggers,
)
from tests.support.pipeline import redis_client, redis_url  # noqa: F401  (fixtures)
from tests.support.redis_cluster import ClusterUnderTest

K = 60


def apns_token(number: int) -> str:
    return f"{number:064x}"


def one_token_wraps(key: ServerKey, count: int, first: int = 0) -> list[dict[str, Any]]:
    return [
        wrap_trigger(encrypt_token(key.public_x, Platform.APNS, apns_token(number)), key.public_x)
        for number in range(first, first + count)
    ]


def raised(**tiers: int) -> dict[str, int]:
    """Every tier out of the way but those given."""
    values = {
        f"marmot_{tier}_per_{period}": 1_000_000
        for tier in ("global", "chunk", "device")
        for period in ("minute", "hour")
    }
    return {**values, **tiers}


async def test_each_gift_wrap_is_unwrapped_once_across_two_servers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str
) -> None:
    apns, _ = fakes
    accepted, duplicate, limited = triggers("accepted"), triggers("duplicate"), triggers("rate_limited")
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(fakes, key, relay.url, redis_url=redis_url, **raised())
        async with serving(settings), serving(settings):
            await relay.publish_all(one_token_wraps(key, K))
            await apns.wait_for(K, timeout=30)
            await settle("accepted", accepted, K)
    # Each wrap reached both servers' readers: one queued it, the other found it claimed.
    assert triggers("accepted") == accepted + K
    assert triggers("duplicate") == duplicate + K
    assert triggers("rate_limited") == limited
    assert sorted(request.token for request in apns.requests) == [apns_token(n) for n in range(K)]


async def test_on_a_redis_cluster_each_wrap_is_unwrapped_once_and_the_budget_holds(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_cluster: ClusterUnderTest
) -> None:
    """Every script's keys share one hash tag: the test Redis Cluster (three primaries) runs them all."""
    apns, _ = fakes
    budget, count = 12, 16
    accepted, limited = triggers("accepted"), triggers("rate_limited")
    redis_cluster.flush()
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        first, second = RedisCluster.from_url(redis_cluster.url), RedisCluster.from_url(redis_cluster.url)
        tiers = raised(marmot_global_per_minute=budget, marmot_global_per_hour=budget)
        settings = marmot_settings(fakes, key, relay.url, **tiers)
        try:
            async with serving(settings, first), serving(settings, second):
                await relay.publish_all(one_token_wraps(key, count))
                await settle("rate_limited", limited, 2 * (count - budget))
                await settle("accepted", accepted, budget)
        finally:
            await first.aclose()
            await second.aclose()
    assert triggers("accepted") == accepted + budget
    assert len({request.token for request in apns.requests}) == apns.count == budget


async def test_a_burst_reaches_apns_exactly_once_through_two_servers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str
) -> None:
    """The relay drops the live events a subscriber falls far behind on: with the shared queue too, a
    relay's readers never wait, here for a burst published at once."""
    apns, _ = fakes
    # Half what tests/test_marmot_burst.py sends one server: both servers share this test's event
    # loop (and the fakes' threads), so a stall of the test process puts both behind at once; 4,000
    # at once lost 55 events at the relay once, in a full run on a loaded machine.
    burst = 2_000
    accepted = triggers("accepted")
    wraps = one_token_wraps(key, burst)
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(fakes, key, relay.url, redis_url=redis_url, **raised())
        async with serving(settings), serving(settings):
            with frozen_heap():  # a long run's full collection would put the readers behind the relay
                await relay.publish_all(wraps)
                await apns.wait_for(burst, timeout=60)
            await settle("accepted", accepted, burst)
    assert sorted(request.token for request in apns.requests) == [apns_token(n) for n in range(burst)]


async def test_the_global_budget_holds_across_two_servers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str
) -> None:
    apns, _ = fakes
    budget = 7
    accepted, limited = triggers("accepted"), triggers("rate_limited")
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        tiers = raised(marmot_global_per_minute=budget, marmot_global_per_hour=budget)
        settings = marmot_settings(fakes, key, relay.url, redis_url=redis_url, **tiers)
        async with serving(settings), serving(settings):
            await relay.publish_all(one_token_wraps(key, 3 * budget))
            # The wraps over budget: refused by both readers (a refused wrap's claim is released).
            await settle("rate_limited", limited, 2 * 2 * budget)
    assert triggers("accepted") == accepted + budget
    assert apns.count == budget


async def test_duplicates_and_the_device_limit_hold_across_two_servers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str
) -> None:
    apns, _ = fakes
    accepted, duplicate = triggers("accepted"), triggers("duplicate")
    device_limited = tokens("apns", "rate_limited")
    token = apns_token(1)
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(
            fakes, key, relay.url, redis_url=redis_url, **raised(marmot_device_per_minute=1)
        )
        async with serving(settings), serving(settings):
            content = encrypt_token(key.public_x, Platform.APNS, apns_token(2))
            # One content in three wraps (re-wrapped by a replayer): acted on once.
            rewrapped = [wrap_trigger(content, key.public_x) for _ in range(3)]
            # One device in four encryptions of its token: pushed once.
            same_device = [
                wrap_trigger(encrypt_token(key.public_x, Platform.APNS, token), key.public_x)
                for _ in range(4)
            ]
            await relay.publish_all(rewrapped + same_device)
            await settle("accepted", accepted, 5)
            await eventually(lambda: triggers("duplicate") >= duplicate + 7 + 2, what="duplicates")
    assert sorted(request.token for request in apns.requests) == sorted([apns_token(2), token])
    assert tokens("apns", "rate_limited") == device_limited + 3
    assert triggers("accepted") == accepted + 5  # 1 of the re-wrapped content, 4 of the device


async def test_the_wraps_of_a_process_gone_are_taken_over(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str, redis_client: Redis
) -> None:
    """A process that took wraps and died before handling them: another takes them over once they have
    waited XMTP_PUSH_QUEUE_RECLAIM_SECONDS, and each is pushed (but one queued too long ago to matter);
    handled, they leave the stream."""
    apns, _ = fakes
    keys = SharedKeys(key.public_hex)
    await redis_client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    (stale,) = one_token_wraps(key, 1, first=99)  # queued long ago (its entry id says when): dropped
    await redis_client.xadd(keys.stream, {"w": json.dumps(["EVENT", "0" * 16, stale])}, id="1000-0")
    for wrap in one_token_wraps(key, 5):
        await redis_client.xadd(keys.stream, {"w": json.dumps(["EVENT", "0" * 16, wrap])})
    taken_at = time.monotonic()
    taken = await redis_client.xreadgroup(GROUP, "gone", {keys.stream: ">"}, count=10)
    assert len(taken[0][1]) == 6
    accepted, backlog = triggers("accepted"), triggers("backlog")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, redis_url=redis_url, queue_reclaim_seconds=1.0)
        async with serving(settings):
            await apns.wait_for(5, timeout=10)
            # Not before they had waited the reclaim period (whenever the server came up).
            first = min(request.received for request in apns.requests) - taken_at
            assert first >= 1.0, f"taken over {first:.2f} s after they were taken"
            await settle("accepted", accepted, 5)
            await eventually(lambda: _stream_empty(redis_client, keys), what="the stream emptied")
    assert sorted(request.token for request in apns.requests) == [apns_token(n) for n in range(5)]
    assert triggers("backlog") == backlog + 1
    assert (await redis_client.xpending(keys.stream, GROUP))["pending"] == 0


async def _stream_empty(redis: Redis, keys: SharedKeys) -> bool:
    return int(await redis.xlen(keys.stream)) == 0


async def test_no_key_holds_a_token_or_an_id_and_all_share_one_hash_tag(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], redis_url: str, redis_client: Redis
) -> None:
    accepted = triggers("accepted")
    token = apns_token(7)
    wrap = gift_wrap(key.public_hex, b64(encrypt_token(key.public_x, Platform.APNS, token)))
    async with running_relay() as relay:
        settings = marmot_settings(
            fakes, key, relay.url, redis_url=redis_url, marmot_chunk_per_minute=5, marmot_device_per_minute=5
        )
        async with serving(settings):
            await relay.publish(wrap)
            await settle("accepted", accepted)
            names = [name.decode() for name in await redis_client.keys("*")]
    tag = names[0][names[0].index("{") : names[0].index("}") + 1]
    assert all(tag in name for name in names), names
    for kind in (":claim:", ":seen:", ":limit:chunk:", ":limit:device:", ":wraps"):
        assert any(kind in name for name in names), (kind, names)
    for secret in (token, wrap.id().to_hex(), key.public_hex):
        assert not any(secret in name for name in names)


async def test_without_redis_a_server_works_alone_and_says_so(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], caplog: pytest.LogCaptureFixture
) -> None:
    apns, _ = fakes
    accepted = triggers("accepted")
    caplog.set_level(logging.INFO, logger="workers.marmot_server")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        await relay.publish(
            gift_wrap(key.public_hex, b64(encrypt_token(key.public_x, Platform.APNS, "ab" * 32)))
        )
        await settle("accepted", accepted)
    alone = [r.getMessage() for r in caplog.records if "works alone" in r.getMessage()]
    assert alone == [
        "Marmot: no XMTP_PUSH_REDIS_URL; this process works alone (its own limits and duplicate memory)"
    ]
    assert apns.count == 1


@pytest.mark.slow
async def test_with_redis_away_a_server_pushes_alone_and_logs_it_once(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], caplog: pytest.LogCaptureFixture
) -> None:
    apns, _ = fakes
    accepted = triggers("accepted")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"  # nothing listens once it is closed
    caplog.set_level(logging.INFO, logger="app.marmot")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url, redis_url=nowhere)):
        for number in range(3):
            await relay.publish(
                gift_wrap(key.public_hex, b64(encrypt_token(key.public_x, Platform.APNS, apns_token(number))))
            )
        await settle("accepted", accepted, 3)
        await asyncio.sleep(1.5)  # the queue's loops retry meanwhile
    assert sorted(request.token for request in apns.requests) == [apns_token(n) for n in range(3)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "Marmot wrap queue: Redis unavailable (ConnectionError); wraps handled by this process alone"
    ], warnings
