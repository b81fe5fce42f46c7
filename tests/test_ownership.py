"""Partition ownership among workers (docs/scaling.md, Processes): rendezvous hashing over heartbeats.

The rule itself is checked on its own; the membership runs on the real Redis test DB, with leases of a
second so a member that stops beating is dropped within the test.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from app.queue.ownership import MEMBERS_KEY, PartitionOwnership, owned_by, owners
from app.queue.redis_link import RedisLink
from tests.support import pipeline as pipeline_support

redis_url = pipeline_support.redis_url
redis_client = pipeline_support.redis_client

PARTITIONS = 64


def test_every_partition_has_exactly_one_owner_and_shares_are_even() -> None:
    members = [f"host-{n}" for n in range(4)]
    table = owners(members, PARTITIONS)
    assert sorted(table) == list(range(PARTITIONS))
    shares = {m: sum(1 for owner in table.values() if owner == m) for m in members}
    assert sum(shares.values()) == PARTITIONS
    assert all(6 <= share <= 26 for share in shares.values()), shares
    assert set().union(*(owned_by(m, members, PARTITIONS) for m in members)) == set(range(PARTITIONS))


def test_a_joining_member_takes_partitions_only_for_itself_and_a_leaving_one_only_gives_its_own() -> None:
    before = owners(["a", "b", "c"], PARTITIONS)
    joined = owners(["a", "b", "c", "d"], PARTITIONS)
    moved = {p for p in range(PARTITIONS) if before[p] != joined[p]}
    assert moved and all(joined[p] == "d" for p in moved)
    left = owners(["a", "c"], PARTITIONS)
    assert all(left[p] == before[p] for p in range(PARTITIONS) if before[p] != "b")


def test_a_member_alone_owns_everything_even_before_its_first_beat() -> None:
    assert owned_by("solo", [], PARTITIONS) == frozenset(range(PARTITIONS))
    assert PartitionOwnership(RedisLink("redis://127.0.0.1:9/0"), "solo", 8, 1.0).owned == frozenset(range(8))


async def test_members_split_the_partitions_and_a_silent_one_is_taken_over_within_its_lease(
    redis_url: str, redis_client: Redis
) -> None:
    lease = 1.0
    link = RedisLink(redis_url)
    a, b, c = (PartitionOwnership(link, name, PARTITIONS, lease) for name in ("a", "b", "c"))
    for member in (a, b, c, a, b):  # a and b beat again once c is in
        await member.beat()
    assert a.members == b.members == c.members == ("a", "b", "c")
    shares = [a.owned, b.owned, c.owned]
    assert set().union(*shares) == set(range(PARTITIONS))
    assert sum(len(s) for s in shares) == PARTITIONS  # disjoint

    # c dies (stops beating, never leaves): gone from every view once its lease ends.
    died = time.monotonic()
    while "c" in a.members or "c" in b.members:  # the live ones keep beating
        assert time.monotonic() - died < lease + 1.0, "a dead member outlived its lease"
        await asyncio.sleep(a.beat_seconds / 4)
        await a.beat()
        await b.beat()
    await a.beat()
    assert a.owned | b.owned == set(range(PARTITIONS)) and not a.owned & b.owned
    assert c.owned <= a.owned | b.owned

    # b stops cleanly: a takes everything at its next beat, not after the lease.
    await b.leave()
    assert await a.beat() == frozenset(range(PARTITIONS))
    assert await redis_client.hkeys(MEMBERS_KEY) == [b"a"]
    await link.close()
