"""Token buckets, charged in order: in Redis, shared by every API process, or in this process.

A bucket of capacity C holds at most C tokens and gains C a minute, evenly. A charge of several
buckets takes each one's cost in turn and stops at the first that cannot pay: the buckets before it
stay charged, the one refusing and those after it are untouched, and the answer says which refused
and when it could pay (a cost larger than the capacity never can: a full minute is said).

In Redis one script charges one call's buckets, all of whose keys are in KEYS and carry one hash tag,
so Redis Cluster runs it on one node; it reads Redis's own clock (TIME), so the processes' clocks do
not matter. A bucket's hash expires once it would be full again: a full bucket and no key are the
same, and Redis holds only the buckets of callers being counted.

Our own script rather than the `limits` library: its strategies are fixed, moving and sliding windows,
not a bucket refilled evenly (the contract's), it checks one limit a call where a call's calls and
topic changes are charged in order in one round trip, and it brings a Redis client of its own, outside
the process's link (its cluster handling, its bound on connections, its failover retries).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import NoScriptError

from app.queue.redis_link import RedisLink
from app.queue.redis_scripts import Script

SECONDS_PER_MINUTE = 60.0
# KEYS: the buckets. ARGV: per bucket its capacity and its cost. {0, 0} when every one paid, else
# {index of the bucket that could not, milliseconds until it could}.
CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 1, #KEYS do
  local cap, cost = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if cost > cap then
    return {i, 60000}
  end
  local b = redis.call('HMGET', KEYS[i], 'n', 't')
  local n = cap
  if b[1] then
    n = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * cap / 60)
  end
  if cost > n then
    return {i, math.ceil((cost - n) * 60000 / cap)}
  end
  n = n - cost
  redis.call('HSET', KEYS[i], 'n', string.format('%.17g', n), 't', string.format('%.17g', now))
  redis.call('PEXPIRE', KEYS[i], math.ceil((cap - n) * 60000 / cap) + 1)
end
return {0, 0}
"""
CHARGE_SCRIPT = Script.of(CHARGE)


@dataclass(frozen=True, slots=True)
class Charge:
    key: str
    capacity: int  # tokens, and tokens gained a minute
    cost: int


@dataclass(frozen=True, slots=True)
class Refused:
    index: int  # of the charge that could not pay
    retry_after_seconds: int  # whole seconds, at least 1


class Buckets(Protocol):
    async def charge(self, charges: Sequence[Charge]) -> Refused | None: ...


def _refused(index: int, seconds: float) -> Refused:
    return Refused(index, max(1, math.ceil(seconds)))


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class LocalBuckets:
    """The buckets of this process alone (no Redis, or Redis away). Buckets that would be full again
    are forgotten now and then, so many callers cost memory only while they are being counted; past
    MAX_BUCKETS the least recently charged half is forgotten too (those callers start afresh: memory
    stays bounded whatever many addresses call)."""

    PRUNE_SECONDS = 30.0
    MAX_BUCKETS = 100_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._capacities: dict[str, int] = {}
        self._next_prune = 0.0

    async def charge(self, charges: Sequence[Charge]) -> Refused | None:
        return self.charge_now(charges)

    def charge_now(self, charges: Sequence[Charge]) -> Refused | None:
        now = self._clock()
        if now >= self._next_prune or len(self._buckets) >= self.MAX_BUCKETS:
            self._prune(now)
        for index, charge in enumerate(charges):
            if charge.cost > charge.capacity:
                return _refused(index, SECONDS_PER_MINUTE)
            bucket = self._buckets.get(charge.key)
            tokens = charge.capacity if bucket is None else self._tokens(bucket, charge.capacity, now)
            if charge.cost > tokens:
                return _refused(index, (charge.cost - tokens) * SECONDS_PER_MINUTE / charge.capacity)
            self._buckets[charge.key] = _Bucket(tokens - charge.cost, now)
            self._capacities[charge.key] = charge.capacity
        return None

    @staticmethod
    def _tokens(bucket: _Bucket, capacity: int, now: float) -> float:
        gained = max(0.0, now - bucket.at) * capacity / SECONDS_PER_MINUTE
        return min(float(capacity), bucket.tokens + gained)

    def _prune(self, now: float) -> None:
        full = [
            key
            for key, bucket in self._buckets.items()
            if self._tokens(bucket, self._capacities[key], now) >= self._capacities[key]
        ]
        for key in full:
            del self._buckets[key], self._capacities[key]
        if len(self._buckets) >= self.MAX_BUCKETS:
            by_age = sorted(self._buckets, key=lambda key: self._buckets[key].at)
            for key in by_age[: len(by_age) // 2 + 1]:
                del self._buckets[key], self._capacities[key]
        self._next_prune = now + self.PRUNE_SECONDS


class RedisBuckets:
    """The buckets in Redis, through the process's link (a single Redis or a cluster). A call that
    Redis does not answer within `timeout` is charged in `fallback` instead: the calls go on, counted
    by this process alone, until Redis answers again (the link says when it fails and recovers)."""

    def __init__(self, link: RedisLink, fallback: LocalBuckets, timeout: float = 0.5) -> None:
        self._link, self._fallback, self._timeout = link, fallback, timeout

    async def charge(self, charges: Sequence[Charge]) -> Refused | None:
        keys = [charge.key for charge in charges]
        args = [value for charge in charges for value in (charge.capacity, charge.cost)]
        try:
            async with asyncio.timeout(self._timeout):
                index, milliseconds = await self._link.run(
                    lambda client: _charge(client, keys, args), retry=False
                )
        except Exception:  # Redis away or slow: counted here meanwhile
            return self._fallback.charge_now(charges)
        return None if not index else _refused(int(index) - 1, int(milliseconds) / 1000)


async def _charge(client: Any, keys: list[str], args: list[int]) -> list[Any]:
    """One command, not a pipeline: a call's charge is on its own, and its keys route it on a cluster.
    A server that does not know the script (restarted, a replica just promoted) is sent its source."""
    try:
        return list(await client.evalsha(CHARGE_SCRIPT.sha, len(keys), *keys, *args))
    except NoScriptError:
        return list(await client.eval(CHARGE_SCRIPT.source, len(keys), *keys, *args))
