"""The parts of the quotas (docs/callers.md#quotas-per-caller): who the caller is, the token buckets
(in this process, and the Redis script every API process shares) charged in order, Redis away, and the
warning when the API listens beyond loopback without the calls quota."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
from redis.asyncio import Redis

from app.core.config import Settings
from app.queue.redis_link import RedisLink
from app.quotas.buckets import Charge, LocalBuckets, RedisBuckets, Refused
from app.quotas.callers import UNKNOWN_PEER, caller_by_address, grpc_peer_host
from app.quotas.quotas import UNLIMITED_CALLERS, unlimited_callers_warning
from tests.support.cli import dev_env, run
from tests.support.ops import free_port
from tests.support.pipeline import redis_url  # noqa: F401  (the test Redis DB, flushed)
from tests.support.process import child

TRUSTED = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


def test_the_peers_address_is_the_caller_unless_it_is_a_trusted_proxy() -> None:
    assert caller_by_address("192.0.2.1", ["198.51.100.1"], TRUSTED) == "address:192.0.2.1"
    assert caller_by_address("192.0.2.1", ["198.51.100.1"], ()) == "address:192.0.2.1"
    assert caller_by_address("10.1.2.3", ["198.51.100.1"], TRUSTED) == "address:198.51.100.1"


def test_the_rightmost_untrusted_forwarded_address_is_the_caller() -> None:
    forwarded = ["203.0.113.66, 198.51.100.1", "10.0.0.2"]  # two headers read as one list
    assert caller_by_address("10.9.9.9", forwarded, TRUSTED) == "address:198.51.100.1"
    # Every hop trusted: the leftmost; no header: the proxy itself.
    assert caller_by_address("10.9.9.9", ["10.0.0.1, 10.0.0.2"], TRUSTED) == "address:10.0.0.1"
    assert caller_by_address("10.9.9.9", [], TRUSTED) == "address:10.9.9.9"
    # A hop that is no address ends the walk at the last one known, never at what the caller wrote.
    assert caller_by_address("10.9.9.9", ["198.51.100.1, junk, 10.0.0.3"], TRUSTED) == "address:10.0.0.3"
    assert caller_by_address("10.9.9.9", ["[2001:db8::1]:443", "198.51.100.4:5000"], TRUSTED) == (
        "address:198.51.100.4"
    )


def test_ipv6_callers_count_by_their_64() -> None:
    one = caller_by_address("2001:db8:1:2::1", [], ())
    assert one == caller_by_address("2001:db8:1:2:ffff::9", [], ()) == "address:2001:db8:1:2::/64"
    assert one != caller_by_address("2001:db8:1:3::1", [], ())
    assert caller_by_address("::ffff:192.0.2.7", [], ()) == "address:192.0.2.7"
    assert caller_by_address("fd00::5", ["2001:db8:7:7::1"], TRUSTED) == "address:2001:db8:7:7::/64"


def test_grpc_peers_are_read() -> None:
    assert grpc_peer_host("ipv4:192.0.2.1:5000") == "192.0.2.1"
    assert grpc_peer_host("ipv6:[2001:db8::1]:5000") == "2001:db8::1"
    assert caller_by_address(grpc_peer_host("unix:/tmp/socket"), [], ()) == UNKNOWN_PEER


def test_local_buckets_refill_evenly_and_stop_at_the_first_refusal() -> None:
    now = [0.0]
    buckets = LocalBuckets(clock=lambda: now[0])
    calls, topics = Charge("c", 6, 1), Charge("t", 60, 50)
    for _ in range(6):
        assert buckets.charge_now([calls]) is None
    assert buckets.charge_now([calls]) == Refused(0, 10)  # one token every 10 s
    now[0] = 10.0
    assert buckets.charge_now([calls, topics]) is None
    # The calls token is taken, the topic changes refused and left whole.
    assert buckets.charge_now([Charge("c2", 6, 1), Charge("t", 60, 20)]) == Refused(1, 10)
    assert buckets.charge_now([Charge("t", 60, 10)]) is None
    assert buckets.charge_now([Charge("t", 60, 61)]) == Refused(0, 60)  # more than it ever holds


def test_local_buckets_are_bounded_in_number() -> None:
    now = [0.0]
    buckets = LocalBuckets(clock=lambda: now[0])
    buckets.MAX_BUCKETS = 100  # type: ignore[misc]
    for n in range(1000):
        now[0] += 0.001
        assert buckets.charge_now([Charge(f"caller-{n}", 10, 1)]) is None
    assert len(buckets._buckets) <= 100
    assert "caller-999" in buckets._buckets  # the latest kept


@pytest.mark.redis
async def test_the_redis_script_charges_as_the_local_buckets_do(redis_url: str) -> None:
    link = RedisLink(redis_url, "false")
    buckets = RedisBuckets(link, LocalBuckets())
    try:
        calls = Charge("xmtp-push:quota:{t}:calls", 3, 1)
        topics = Charge("xmtp-push:quota:{t}:topic-changes", 100, 60)
        for _ in range(3):
            assert await buckets.charge([calls]) is None
        refused = await buckets.charge([calls, topics])
        assert refused is not None and refused.index == 0 and 1 <= refused.retry_after_seconds <= 20
        assert await buckets.charge([Charge("xmtp-push:quota:{u}:calls", 3, 1), topics]) is None
        refused = await buckets.charge([topics])
        assert refused is not None and refused.index == 0 and 11 <= refused.retry_after_seconds <= 12
        assert await buckets.charge([Charge(topics.key, 100, 101)]) == Refused(0, 60)
        client = Redis.from_url(redis_url)
        try:
            # The hash is gone once it would be full again: 3 tokens back in at most 60 s.
            assert 0 < await client.pttl(calls.key) <= 60_001
        finally:
            await client.aclose()
    finally:
        await link.close()


async def test_without_redis_the_process_counts_alone() -> None:
    fallback = LocalBuckets()
    link = RedisLink("redis://127.0.0.1:1/0", "false")
    buckets = RedisBuckets(link, fallback)
    try:
        assert await buckets.charge([Charge("k", 1, 1)]) is None
        assert await buckets.charge([Charge("k", 1, 1)]) == Refused(0, 60)
    finally:
        await link.close()


@pytest.mark.parametrize(
    ("hosts", "calls", "warned"),
    [
        (("127.0.0.1", "127.0.0.1"), 0, False),
        (("localhost", "::1"), 0, False),
        (("0.0.0.0", "127.0.0.1"), 0, True),
        (("127.0.0.1", "::"), 0, True),
        (("0.0.0.0", "0.0.0.0"), 600, False),
    ],
)
def test_listening_beyond_loopback_without_the_calls_quota_is_warned(
    hosts: tuple[str, str], calls: int, warned: bool
) -> None:
    settings = Settings(http_host=hosts[0], grpc_host=hosts[1], caller_calls_per_minute=calls)
    assert unlimited_callers_warning(settings) == (UNLIMITED_CALLERS if warned else None)


@pytest.mark.slow
async def test_config_check_and_the_start_of_dev_give_the_warning(tmp_path: Path) -> None:
    env = dev_env(tmp_path, free_port(), free_port(), XMTP_PUSH_GRPC_HOST="0.0.0.0")
    result = run(["config", "check", "--role", "dev"], env, tmp_path)
    assert result.stderr.count(UNLIMITED_CALLERS) == 1, result.stderr
    async with child("dev", ["dev"], env) as process:
        await process.line(re.compile("serving http="))
        assert sum(UNLIMITED_CALLERS in line for line in process.lines) == 1, process.output()
        await process.stop()
    quiet = {**env, "XMTP_PUSH_CALLER_CALLS_PER_MINUTE": "600"}
    assert UNLIMITED_CALLERS not in run(["config", "check", "--role", "dev"], quiet, tmp_path).stderr
