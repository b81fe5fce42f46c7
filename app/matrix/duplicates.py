"""Which (app id, pushkey, event id) were delivered in the last ten minutes.

A homeserver sends a notification again when our answer did not reach it in time; a repeat of
one already delivered is answered without sending it again, and a failed one is sent again. The
memory is kept in the process, or in Redis (XMTP_PUSH_REDIS_URL) so every gateway process shares
it. Keys are a hash of the three values, never the values themselves. Redis trouble never fails a
request: within a short bound, an unanswered lookup counts as not seen.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from app.queue.redis_link import ClusterMode, RedisLink, client_of

DUPLICATE_WINDOW_SECONDS = 600
MEMORY_LIMIT = 250_000  # keys kept in a process at most (about 125 bytes each): past it the oldest go first
REDIS_PREFIX = "xmtp-push:matrix:delivered:"
REDIS_CALL_SECONDS = 0.5

log = logging.getLogger(__name__)


def delivery_key(app_id: str, pushkey: str, event_id: str) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in (app_id, pushkey, event_id):
        raw = part.encode()
        digest.update(len(raw).to_bytes(4, "big") + raw)
    return digest.digest()


class DeliveredMemory(Protocol):
    async def delivered(self, key: bytes) -> bool: ...

    async def remember(self, key: bytes) -> None: ...

    async def close(self) -> None: ...


class ProcessMemory:
    """In this process: insertion order is expiry order, so the oldest go first."""

    def __init__(
        self,
        window: float = DUPLICATE_WINDOW_SECONDS,
        limit: int = MEMORY_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window, self._limit, self._clock = window, limit, clock
        self._expiry: dict[bytes, float] = {}

    async def delivered(self, key: bytes) -> bool:
        self._prune()
        return key in self._expiry

    async def remember(self, key: bytes) -> None:
        self._expiry.pop(key, None)
        self._expiry[key] = self._clock() + self._window
        self._prune()

    def _prune(self) -> None:
        now = self._clock()
        expiry = self._expiry
        while expiry:
            oldest = next(iter(expiry))
            if expiry[oldest] > now and len(expiry) <= self._limit:
                return
            del expiry[oldest]

    async def close(self) -> None:
        self._expiry.clear()


class RedisMemory:
    """In Redis (a single one or a cluster: each call touches one key), shared by every gateway
    process; a key expires with its window."""

    def __init__(self, redis: Any, window: int = DUPLICATE_WINDOW_SECONDS) -> None:
        self._redis, self._window = redis, window

    @classmethod
    def from_url(cls, url: str, cluster: ClusterMode = "auto", max_connections: int = 64) -> RedisMemory:
        return cls(RedisLink(url, cluster, max_connections))

    async def delivered(self, key: bytes) -> bool:
        try:
            async with asyncio.timeout(REDIS_CALL_SECONDS):
                client = await client_of(self._redis)
                return bool(await client.exists(REDIS_PREFIX + key.hex()))
        except Exception as error:  # Redis down or slow: send rather than fail the request
            log.warning("duplicate lookup skipped: Redis %s", type(error).__name__)
            return False

    async def remember(self, key: bytes) -> None:
        try:
            async with asyncio.timeout(REDIS_CALL_SECONDS):
                client = await client_of(self._redis)
                await client.set(REDIS_PREFIX + key.hex(), b"1", ex=self._window)
        except Exception as error:
            log.warning("delivery not remembered: Redis %s", type(error).__name__)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(REDIS_CALL_SECONDS):
                return bool(await (await client_of(self._redis)).ping())
        except Exception:
            return False

    async def close(self) -> None:
        await (self._redis.close() if isinstance(self._redis, RedisLink) else self._redis.aclose())
