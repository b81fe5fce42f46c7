"""The work queue on Redis Streams: one consumer group shared by every worker process.

Entries carry one field, `p`, the payload. Acknowledged entries are deleted,
so a stream's length is its depth. Delayed retries wait in a sorted set scored
by due time and are moved onto their stream by a script, atomically.

Adds and commits are Lua scripts too: one command carrying every payload, run
atomically by Redis, rather than a MULTI/EXEC pipeline of one XADD per entry
(whose per-command client-side packing and reply parsing cost more than the
work itself: a fan-out page of 1,000 jobs is one round trip and one reply).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.queue.base import Commit, Entry

GROUP_NAME = "workers"
GROUP = GROUP_NAME.encode()
FIELD = b"p"
PREFIX = "xmtp-push:"
DELAYED_KEY = PREFIX + "delayed"
CLAIM_PREFIX = PREFIX + "claim:"
RETRY_KEY_PREFIX = PREFIX + "delayed-key:"
# How long a delayed key's holder outlives its due time (it is promoted by then).
KEY_GRACE_SECONDS = 600

_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local sep = string.find(member, '\\n', 1, true)
  redis.call('XADD', ARGV[3] .. string.sub(member, 1, sep - 1), '*', 'p', string.sub(member, sep + 1))
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""
# Many values travel as two arguments, their lengths ("12,15,...") and their bytes run together,
# which `split` cuts apart: packing one argument per value cost the client more than Redis spends
# on the commands. Binary-safe, as every payload may be any bytes.
_SPLIT = """
local function split(lengths, blob)
  local parts, pos = {}, 1
  for length in string.gmatch(lengths, '%d+') do
    local next_pos = pos + tonumber(length)
    parts[#parts + 1] = string.sub(blob, pos, next_pos - 1)
    pos = next_pos
  end
  return parts
end
"""
# Keys and owners travel packed, and the reply is one string of "1"/"0" flags. Claim keys are
# built here from the prefix in ARGV[1].
_CLAIM = (
    _SPLIT
    + """
local keys = split(ARGV[3], ARGV[4])
local owners = split(ARGV[5], ARGV[6])
local ttl = tonumber(ARGV[2])
local flags = {}
for i, key in ipairs(keys) do
  key = ARGV[1] .. key
  local owner = owners[i]
  if redis.call('SET', key, owner, 'NX', 'EX', ttl) or redis.call('GET', key) == owner then
    flags[i] = '1'
  else
    flags[i] = '0'
  end
end
return table.concat(flags)
"""
)

# A stream's payloads travel packed.
_ADD_ALL = (
    _SPLIT
    + """
local function add_all(key, lengths, blob)
  for _, payload in ipairs(split(lengths, blob)) do
    redis.call('XADD', key, '*', 'p', payload)
  end
end
"""
)
_ADD = _ADD_ALL + "add_all(KEYS[1], ARGV[1], ARGV[2])\nreturn 1\n"
# A keyed delay replaces the one its key holds unless that one ranks higher (then it is dropped).
# The key's holder is a string "rank\nmember" that expires once the delay is long due.
_DELAY = """
local function delay(set, score, member, key, rank, ttl)
  if key ~= '' then
    local held = redis.call('GET', key)
    if held then
      local sep = string.find(held, '\\n', 1, true)
      if tonumber(string.sub(held, 1, sep - 1)) > rank then return end
      redis.call('ZREM', set, string.sub(held, sep + 1))
    end
    redis.call('SET', key, rank .. '\\n' .. member, 'EX', ttl)
  end
  redis.call('ZADD', set, score, member)
end
"""
# KEYS: the acknowledged stream, the delayed set, then every stream that gets additions.
# ARGV: group; per addition stream its lengths and payloads; the delay count then (score,
# member, key, rank, ttl) for each; the ack count then the ids. Order of effects: additions,
# delays, then XACK and XDEL of the handled entries.
_COMMIT = (
    _ADD_ALL
    + _DELAY
    + """
local a = 2
for k = 3, #KEYS do
  add_all(KEYS[k], ARGV[a], ARGV[a + 1]); a = a + 2
end
local delays = tonumber(ARGV[a]); a = a + 1
for _ = 1, delays do
  delay(KEYS[2], ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4]); a = a + 5
end
local acks = tonumber(ARGV[a]); a = a + 1
local done = 0
while done < acks do
  local ids = {}
  for j = 1, math.min(1000, acks - done) do ids[j] = ARGV[a + done + j - 1] end
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  done = done + #ids
end
return 1
"""
)


def connect(url: str) -> Redis:
    # RESP2 replies (lists of [id, fields]); the parsing below relies on that shape.
    return Redis.from_url(
        url, protocol=2, socket_timeout=30, socket_connect_timeout=10, health_check_interval=30
    )


def _as_sent(response: Any, **options: Any) -> Any:
    return response


class RedisQueue:
    def __init__(self, redis: Redis, reclaim_seconds: float) -> None:
        self._redis = redis
        # Stream reads are taken as Redis sends them and parsed once by `_read_entries`, rather than
        # first into a tuple and a dict per entry by the client's own reply callback.
        redis.set_response_callback("XREADGROUP", _as_sent)
        self._reclaim_ms = max(1, int(reclaim_seconds * 1000))
        self._groups: set[str] = set()
        self._last_reclaim: dict[str, float] = {}
        self._promote = redis.register_script(_PROMOTE)
        self._claim = redis.register_script(_CLAIM)
        self._add = redis.register_script(_ADD)
        self._commit = redis.register_script(_COMMIT)

    @classmethod
    def from_url(cls, url: str, reclaim_seconds: float) -> RedisQueue:
        return cls(connect(url), reclaim_seconds)

    @property
    def redis(self) -> Redis:
        return self._redis

    @staticmethod
    def _key(stream: str) -> str:
        return PREFIX + stream

    async def _ensure_group(self, key: str) -> None:
        if key in self._groups:
            return
        try:
            # From the start, so entries added before any worker existed are read.
            await self._redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._groups.add(key)

    async def add(self, stream: str, payloads: Sequence[bytes]) -> None:
        if payloads:
            await self._add(keys=[self._key(stream)], args=_packed(payloads))

    async def read(self, stream: str, consumer: str, count: int, block_seconds: float) -> list[Entry]:
        key = self._key(stream)
        await self._ensure_group(key)
        try:
            entries = await self._reclaim(key, consumer, count)
            if len(entries) < count:
                block = max(1, int(block_seconds * 1000)) if not entries else None
                reply: Any = await self._redis.xreadgroup(
                    GROUP_NAME, consumer, {key: ">"}, count=count - len(entries), block=block
                )
                entries.extend(_read_entries(reply[0][1]) if reply else [])
        except ResponseError as error:
            # The stream and its group vanished under us (a Redis restarted without its data, a deleted
            # key): forget the group so the next read creates it again instead of failing forever.
            if not str(error).startswith(("NOGROUP", "UNBLOCKED")):
                raise
            self._groups.discard(key)
            return []
        return entries

    async def _reclaim(self, key: str, consumer: str, count: int) -> list[Entry]:
        # XAUTOCLAIM scans the pending list; a few times per reclaim period is enough.
        now = time.monotonic()
        if now - self._last_reclaim.get(key, 0.0) < self._reclaim_ms / 4000:
            return []
        self._last_reclaim[key] = now
        reply = await self._redis.xautoclaim(key, GROUP, consumer, self._reclaim_ms, "0-0", count=count)
        return _entries(reply[1])

    async def commit(self, stream: str, commit: Commit) -> None:
        if not commit:
            return
        keys = [self._key(stream), DELAYED_KEY]
        args: list[Any] = [GROUP]
        for target, payloads in commit.add.items():
            if payloads:
                keys.append(self._key(target))
                args.extend(_packed(payloads))
        # One member per payload, the last due time winning, as ZADD with a mapping did.
        delayed = {d.stream.encode() + b"\n" + d.payload: d for d in commit.delay}
        args.append(len(delayed))
        now = time.time()
        for member, d in delayed.items():
            key = RETRY_KEY_PREFIX + d.key if d.key else ""
            args.extend(
                (repr(float(d.due)), member, key, d.rank, int(max(0.0, d.due - now)) + KEY_GRACE_SECONDS)
            )
        args.append(len(commit.ack))
        args.extend(commit.ack)
        await self._commit(keys=keys, args=args)

    async def promote_due(self, now: float, limit: int) -> int:
        return int(await self._promote(keys=[DELAYED_KEY], args=[now, limit, PREFIX]))

    async def claim_once(self, claims: Sequence[tuple[str, str]], ttl_seconds: int) -> list[bool]:
        if not claims:
            return []
        keys = _packed([key.encode() for key, _ in claims])
        owners = _packed([owner.encode() for _, owner in claims])
        reply = await self._claim(keys=[], args=[CLAIM_PREFIX, ttl_seconds, *keys, *owners])
        return [flag == 49 for flag in reply]  # b"1"

    async def depth(self, stream: str) -> int:
        return int(await self._redis.xlen(self._key(stream)))

    async def oldest(self, stream: str) -> float | None:
        # Acknowledged entries are deleted, so the first one left is the oldest waiting or in flight;
        # its id starts with the milliseconds at which it was added.
        first = await self._redis.xrange(self._key(stream), count=1)
        if not first:
            return None
        return int(_text(first[0][0] or b"0").partition("-")[0]) / 1000

    async def delayed_count(self) -> int:
        return int(await self._redis.zcard(DELAYED_KEY))

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        key = self._key(stream)
        try:
            consumers = await self._redis.xinfo_consumers(key, GROUP_NAME)
        except ResponseError:  # no such stream or group yet
            return 0
        retired = 0
        for consumer in consumers:
            name = _text(consumer["name"])
            idle = int(consumer["idle"]) / 1000
            if consumer["pending"] == 0 and (name in names or idle > idle_seconds):
                await self._redis.xgroup_delconsumer(key, GROUP_NAME, name)  # answers its pending: 0
                retired += 1
        return retired

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except Exception:
            return False

    async def close(self) -> None:
        await self._redis.aclose()


def _packed(payloads: Sequence[bytes]) -> list[bytes]:
    """The two script arguments that carry a stream's payloads."""
    return [b",".join(b"%d" % len(p) for p in payloads), b"".join(payloads)]


def _read_entries(raw: Any) -> list[Entry]:
    """XREADGROUP's entries as sent: [id, [field, value, ...]], the fields empty once deleted."""
    entries = []
    for entry_id, fields in raw:
        if fields:
            entries.append(Entry(_text(entry_id), _payload_of(fields)))
    return entries


def _payload_of(fields: list[bytes]) -> bytes:
    if fields[0] == FIELD:  # the only field every entry is written with
        return fields[1]
    return dict(zip(fields[::2], fields[1::2], strict=True))[FIELD]


def _entries(raw: Any) -> list[Entry]:
    entries = []
    for entry_id, fields in raw:
        if fields:  # an entry deleted while pending comes back without fields
            entries.append(Entry(_text(entry_id), fields[FIELD]))
    return entries


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
