"""The gift wraps of one server key shared in Redis by every `xmtp-push marmot` process serving it:
each wrap is unwrapped by exactly one of them.

Every process reads the same relays. A relay's reader never waits: it offers each live gift wrap to
a bounded outbox, which one task drains into Redis, many wraps per round trip. For each wrap one
atomic script claims the wrap (SET NX on a digest of the whole event, so the same event from another
relay or another process is claimed once), charges the global budget (once per wrap, before any
unwrapping, for all processes at once) and adds it to one Redis stream. The claim covers every field
of the event, signature included, not only its id: a copy altered under the same id (which anyone can
make from a wrap seen on a relay) must not take the true wrap's place.

Every process's handlers take from that stream through one consumer group (XREADGROUP), at most as many
wraps as its handlers have room for, so an idle process takes more; each wrap is acknowledged and
deleted once handled. A process that dies leaves its wraps pending: the others take them over
(XAUTOCLAIM) once they have waited XMTP_PUSH_QUEUE_RECLAIM_SECONDS.

With Redis away, a wrap the outbox cannot queue is handled by this process alone, with its own limits
(as without Redis), and the change is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from app.marmot.admission import Tier
from app.marmot.pending import PendingTriggers
from app.marmot.shared_limits import BUCKET_LUA, SharedKeys
from app.marmot.triggers import TriggerResult, count_trigger

log = logging.getLogger("app.marmot.wrap_queue")

GROUP = "handlers"
# A wrap's claim outlives any relay's delay in passing it on (the same as one process's memory of
# the wraps it unwrapped).
CLAIM_SECONDS = 600.0
# The stream holds only wraps not yet handled; this bounds it while no process takes them.
STREAM_MAXLEN = 20_000
TAKE_BLOCK_MS = 1000
# Wraps taken per read: wraps queued together (one script adds many) are shared among the processes
# waiting for them, rather than all going to the first.
TAKE_COUNT = 8
QUEUE_BATCH = 256  # wraps per round trip to Redis, and at most this many bytes of them:
QUEUE_BATCH_BYTES = 1 << 20
ACK_BATCH = 512
RETRY_SECONDS = 1.0
# A wrap left queued this long (no process was taking them) is dropped unhandled, counted as backlog.
STALE_SECONDS = 600.0
# A consumer with nothing pending, silent this many reclaim periods, is a process gone: forgotten.
FORGET_AFTER_PERIODS = 10

# KEYS: the wraps' claims, then the global bucket, then the stream. ARGV: the claims' lifetime (ms),
# the global tier's caps, the stream's bound, then the wraps (one per claim). For each wrap: 1 queued,
# 0 claimed before, 2 over the global budget (its claim released: the same wrap from another relay may
# still be admitted later).
_CLAIM = (
    BUCKET_LUA
    + """
local n = #KEYS - 2
local now, results = now_seconds(), {}
for i = 1, n do
  if not redis.call('SET', KEYS[i], '1', 'NX', 'PX', ARGV[1]) then
    results[i] = 0
  elseif charge(KEYS[n + 1], tonumber(ARGV[2]), tonumber(ARGV[3]), now) == 0 then
    redis.call('DEL', KEYS[i])
    results[i] = 2
  else
    redis.call('XADD', KEYS[n + 2], 'MAXLEN', '~', ARGV[4], '*', 'w', ARGV[4 + i])
    results[i] = 1
  end
end
return results
"""
)

# KEYS[1]: the stream. ARGV: the group, then the ids handled.
_DONE = """
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
return redis.call('XDEL', KEYS[1], unpack(ids))
"""

QUEUED, CLAIMED_BEFORE, OVER_BUDGET = 1, 0, 2
WRAP_FIELDS = ("id", "pubkey", "created_at", "kind", "tags", "content", "sig")
# Stream entries as redis-py gives them: (id, fields), fields None for an entry trimmed away.
Entries = list[tuple[bytes, dict[bytes, bytes] | None]]


@dataclass(frozen=True, slots=True)
class QueuedWrap:
    """A gift wrap for a handler: its relay frame's text, and its stream entry (None: Redis was away
    when it came, and this process handles it alone)."""

    text: str
    entry: str | None


def wrap_digest(event: Mapping[str, Any]) -> bytes:
    """SHA-256 over every field of the event (any change to any of them gives another digest); each
    field by its repr, which is unambiguous and cheaper than JSON for a large content."""
    digest = hashlib.sha256()
    for name in WRAP_FIELDS:
        digest.update(repr(event.get(name)).encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.digest()


def consumer_name() -> str:
    """This process's name in the consumer group: unique per start."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _queued_seconds_ago(entry: str) -> float:
    """How long ago Redis queued a stream entry, by its id (milliseconds on Redis's clock, less this
    host's: a skew of seconds does not matter at STALE_SECONDS)."""
    return time.time() - int(entry.split("-", 1)[0]) / 1000


async def _restarted(loop: Callable[[], Awaitable[None]]) -> None:
    """`loop()`, started again after a failure (a bug): a queue's loop must not end unnoticed."""
    while True:
        try:
            await loop()
        except Exception as error:
            log.error("Marmot wrap queue: %s failed (%s); restarted", loop.__name__, type(error).__name__)
            await asyncio.sleep(RETRY_SECONDS)


class Room:
    """How many more wraps this process's handlers can take."""

    def __init__(self, size: int) -> None:
        self._size, self._held = size, 0
        self._free = asyncio.Event()
        self._free.set()

    async def wait(self) -> int:
        await self._free.wait()
        return self._size - self._held

    def take(self, count: int) -> None:
        self._held += count
        if self._held >= self._size:
            self._free.clear()

    def give_back(self) -> None:
        self._held -= 1
        self._free.set()


class StateLog:
    """One log line per change between Redis answering and not."""

    def __init__(self) -> None:
        self.failing = False

    def note(self, error: BaseException | None) -> None:
        if (error is not None) == self.failing:
            return
        self.failing = error is not None
        if error is not None:
            log.warning(
                "Marmot wrap queue: Redis unavailable (%s); wraps handled by this process alone",
                type(error).__name__,
            )
        else:
            log.info("Marmot wrap queue: Redis answers again; wraps shared again")


class FrameHandler(Protocol):
    async def handle_frame(self, text: str, entry: str | None) -> object: ...


@dataclass(frozen=True, slots=True)
class QueueSettings:
    handlers: int  # MARMOT_MAX_CONCURRENT: also the most wraps this process takes at once
    pending_bytes: int  # MARMOT_PENDING_BYTES: the outbox's bound, and the handlers' buffer's
    global_tier: Tier
    reclaim_seconds: float


class WrapQueue:
    """This process's part of the shared queue: its relays' wraps queued, its handlers' share taken."""

    def __init__(
        self, redis: Redis, keys: SharedKeys, handler: FrameHandler, settings: QueueSettings
    ) -> None:
        self._redis, self._keys, self._handler, self._settings = redis, keys, handler, settings
        self._consumer = consumer_name()
        self._pending: PendingTriggers[QueuedWrap] = PendingTriggers(
            self, settings.handlers, settings.pending_bytes
        )
        self._outbox: deque[tuple[bytes, str]] = deque()  # (wrap digest, frame text)
        self._outbox_bytes, self._outbox_ready = 0, asyncio.Event()
        self._room = Room(settings.handlers)
        self._in_flight: set[str] = set()  # entries this process holds
        self._acks: list[str] = []
        self._acks_ready = asyncio.Event()
        self._state = StateLog()
        self._claim = redis.register_script(_CLAIM)
        self._done = redis.register_script(_DONE)

    def offer(self, event: Mapping[str, Any], text: str) -> None:
        """A live gift wrap from a relay's reader, never waiting: queued soon, or refused (counted)
        when the outbox is full."""
        if self._outbox_bytes + len(text) > self._settings.pending_bytes:
            count_trigger(TriggerResult.RATE_LIMITED)
            return
        self._outbox.append((wrap_digest(event), text))
        self._outbox_bytes += len(text)
        self._outbox_ready.set()

    @contextlib.asynccontextmanager
    async def serving(self, grace: float) -> AsyncIterator[None]:
        """Queueing, taking and handling for the block's duration; on the way out the wraps held get
        `grace` seconds, and what is left of them stays pending for another process."""
        acks = asyncio.create_task(_restarted(self._ack_loop))
        try:
            async with self._pending.serving(grace):
                loops = [
                    asyncio.create_task(_restarted(loop))
                    for loop in (self._queue_loop, self._take_loop, self._reclaim_loop)
                ]
                try:
                    yield
                finally:
                    for loop in loops:
                        loop.cancel()
                    await asyncio.gather(*loops, return_exceptions=True)
        finally:
            acks.cancel()
            await asyncio.gather(acks, return_exceptions=True)
            await self._flush_acks()

    # ---- the handlers' side (PendingTriggers' sink)

    async def handle(self, wrap: QueuedWrap) -> None:
        try:
            await self._handler.handle_frame(wrap.text, wrap.entry)
        except asyncio.CancelledError:  # not handled: left pending for another process
            self._release(wrap.entry, handled=False)
            raise
        except Exception:
            self._release(wrap.entry, handled=True)  # a bug: not repeated
            raise
        self._release(wrap.entry, handled=True)

    def _release(self, entry: str | None, *, handled: bool) -> None:
        if entry is None:
            return
        self._room.give_back()
        self._in_flight.discard(entry)
        if handled:
            self._acks.append(entry)
            self._acks_ready.set()

    # ---- relays to Redis

    async def _queue_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                await self._queue_batch(self._next_batch())

    def _next_batch(self) -> list[tuple[bytes, str]]:
        batch: list[tuple[bytes, str]] = []
        size = 0
        while self._outbox and len(batch) < QUEUE_BATCH and size < QUEUE_BATCH_BYTES:
            digest, text = self._outbox.popleft()
            batch.append((digest, text))
            size += len(text)
        self._outbox_bytes -= size
        return batch

    async def _queue_batch(self, batch: list[tuple[bytes, str]]) -> None:
        keys = [self._keys.claim(digest) for digest, _ in batch]
        keys += [self._keys.global_bucket, self._keys.stream]
        tier = self._settings.global_tier
        args = [int(CLAIM_SECONDS * 1000), tier.per_minute, tier.per_hour, STREAM_MAXLEN]
        try:
            results = await self._claim(keys, args + [text for _, text in batch])
        except (RedisError, OSError) as error:
            self._state.note(error)
            for _, text in batch:  # handled here alone, with this process's own limits
                self._pending.offer(QueuedWrap(text, None), len(text))
            return
        self._state.note(None)
        for result in results:
            if result == CLAIMED_BEFORE:
                count_trigger(TriggerResult.DUPLICATE)
            elif result == OVER_BUDGET:
                count_trigger(TriggerResult.RATE_LIMITED)

    # ---- Redis to the handlers

    async def _take_loop(self) -> None:
        await self._ensure_group()
        while True:
            room = await self._room.wait()
            try:
                answer = await self._redis.xreadgroup(
                    GROUP,
                    self._consumer,
                    {self._keys.stream: ">"},
                    count=min(room, TAKE_COUNT),
                    block=TAKE_BLOCK_MS,
                )
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                await self._ensure_group()
                continue
            except (RedisError, OSError) as error:
                self._state.note(error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self._state.note(None)
            for _, entries in cast(list[tuple[bytes, Entries]], answer or []):
                self._hand_over(entries)

    async def _ensure_group(self) -> None:
        while True:
            try:
                await self._redis.xgroup_create(self._keys.stream, GROUP, id="0", mkstream=True)
                return
            except ResponseError as error:
                if "BUSYGROUP" in str(error):
                    return
                raise
            except (RedisError, OSError) as error:
                self._state.note(error)
                await asyncio.sleep(RETRY_SECONDS)

    def _hand_over(self, entries: Entries) -> None:
        for raw_id, fields in entries:
            entry = raw_id.decode()
            if entry in self._in_flight or not fields or b"w" not in fields:
                continue  # already ours, or trimmed away
            self._room.take(1)
            self._in_flight.add(entry)
            if _queued_seconds_ago(entry) > STALE_SECONDS:  # a hint that old is pointless
                count_trigger(TriggerResult.BACKLOG)
                self._release(entry, handled=True)
                continue
            text = fields[b"w"].decode()
            if not self._pending.offer(QueuedWrap(text, entry), len(text)):
                self._release(entry, handled=True)  # refused (counted): not repeated

    async def _reclaim_loop(self) -> None:
        period = self._settings.reclaim_seconds
        while True:
            await asyncio.sleep(max(0.05, period / 2))
            try:
                await self._reclaim(int(period * 1000))
                await self._forget_gone(int(period * 1000 * FORGET_AFTER_PERIODS))
            except (RedisError, OSError) as error:
                self._state.note(error)

    async def _reclaim(self, idle_ms: int) -> None:
        room = await self._room.wait()
        answer = await self._redis.xautoclaim(
            self._keys.stream, GROUP, self._consumer, idle_ms, start_id="0-0", count=room
        )
        self._hand_over(answer[1])

    async def _forget_gone(self, idle_ms: int) -> None:
        for consumer in await self._redis.xinfo_consumers(self._keys.stream, GROUP):
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else name
            if name != self._consumer and not consumer["pending"] and consumer["idle"] > idle_ms:
                await self._redis.xgroup_delconsumer(self._keys.stream, GROUP, name)

    # ---- acknowledgements

    async def _ack_loop(self) -> None:
        while True:
            await self._acks_ready.wait()
            self._acks_ready.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        while self._acks:
            batch, self._acks = self._acks[:ACK_BATCH], self._acks[ACK_BATCH:]
            try:
                await self._done([self._keys.stream], [GROUP, *batch])
            except (RedisError, OSError) as error:  # left pending: repeated after the reclaim time
                self._state.note(error)
                return
