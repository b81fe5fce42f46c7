"""Abuse controls for triggers: rate tiers by key, and the memory of triggers already acted on.

The server pays for ECDH before it knows anything, so every tier is charged before the work it
guards: the global budget before a gift wrap is unwrapped, a chunk's limit before its ECDH, a
device's limit before its push. Each key is a SHA-256 digest (never a token or a chunk itself).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.queue.redis_link import RedisLink, client_of

log = logging.getLogger("app.marmot")

# Keys remembered per limiter: past this the least recently charged key is forgotten (its budget
# is full again), so hostile traffic cannot grow memory without bound.
MAX_LIMITER_KEYS = 100_000
# Transponder keeps 100,000 recent trigger digests.
MAX_DEDUP_ENTRIES = 100_000
DEDUP_KEY_PREFIX = "xmtp-push:marmot:seen:"
MINUTE, HOUR = 60.0, 3600.0


class Tier(NamedTuple):
    per_minute: int
    per_hour: int


class RateLimiter:
    """Two token buckets per key, one refilling per minute and one per hour; a charge takes a token
    from both or from neither."""

    def __init__(
        self,
        tier: Tier,
        max_keys: int = MAX_LIMITER_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._minute_cap, self._hour_cap = float(tier.per_minute), float(tier.per_hour)
        self._minute_rate, self._hour_rate = tier.per_minute / MINUTE, tier.per_hour / HOUR
        self._max_keys, self._clock = max_keys, clock
        # key -> [minute tokens, hour tokens, when they were counted]
        self._buckets: OrderedDict[bytes, list[float]] = OrderedDict()

    def charge(self, key: bytes = b"") -> bool:
        """Take one token for `key`; False (and nothing taken) when either bucket is empty."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = [self._minute_cap, self._hour_cap, now]
            if len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            elapsed = now - bucket[2]
            bucket[0] = min(self._minute_cap, bucket[0] + elapsed * self._minute_rate)
            bucket[1] = min(self._hour_cap, bucket[1] + elapsed * self._hour_rate)
            bucket[2] = now
        if bucket[0] < 1.0 or bucket[1] < 1.0:
            return False
        bucket[0] -= 1.0
        bucket[1] -= 1.0
        return True


class RecentDigests:
    """Digests seen within the last `seconds`, at most `max_entries` of them (the oldest go first)."""

    def __init__(
        self,
        seconds: float,
        max_entries: int = MAX_DEDUP_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds, self._max_entries, self._clock = seconds, max_entries, clock
        self._expiry: OrderedDict[bytes, float] = OrderedDict()  # in order of expiry: one lifetime

    def add(self, digest: bytes) -> bool:
        """Remember `digest`; False when it was already remembered."""
        now = self._clock()
        self._forget_expired(now)
        if digest in self._expiry:
            return False
        self._expiry[digest] = now + self._seconds
        if len(self._expiry) > self._max_entries:
            self._expiry.popitem(last=False)
        return True

    def contains(self, digest: bytes) -> bool:
        expires = self._expiry.get(digest)
        return expires is not None and expires > self._clock()

    def _forget_expired(self, now: float) -> None:
        while self._expiry:
            digest, expires = next(iter(self._expiry.items()))
            if expires > now:
                return
            del self._expiry[digest]


class Dedup:
    """Whether a trigger's content was acted on recently: in this process's memory, and in Redis when
    one is configured, so that instances serving one key for availability push once."""

    def __init__(self, seconds: float, redis: Redis | RedisLink | None = None) -> None:
        self._memory = RecentDigests(seconds)
        self._redis = redis
        self._ttl_ms = max(1, int(seconds * 1000))
        self._redis_failing = False

    async def first_time(self, digest: bytes) -> bool:
        if not self._memory.add(digest):
            return False
        if self._redis is None:
            return True
        try:
            client = await client_of(self._redis)
            stored = await client.set(DEDUP_KEY_PREFIX + digest.hex(), b"1", nx=True, px=self._ttl_ms)
        except (RedisError, OSError) as error:
            # A hint is advisory: with Redis away this instance still pushes (once, by its memory).
            self._log_redis(failing=True, error=error)
            return True
        self._log_redis(failing=False)
        return bool(stored)

    def _log_redis(self, *, failing: bool, error: BaseException | None = None) -> None:
        if failing == self._redis_failing:
            return
        self._redis_failing = failing
        if failing:
            log.warning(
                "Marmot duplicate memory: Redis unavailable (%s); using this process's memory only",
                type(error).__name__,
            )
        else:
            log.info("Marmot duplicate memory: Redis answers again")
