"""The abuse limits and the duplicate memory of one server key, shared in Redis by every process serving
it, so that N processes admit what one would.

Each tier is the same pair of token buckets as app.marmot.admission.RateLimiter (one refilling per
minute, one per hour; a charge takes a token from both or from neither), kept in a Redis hash per key
and charged by an atomic Lua script on Redis's own clock (TIME), so the processes' clocks do not
matter. A bucket's hash expires once both its buckets would be full again: a full bucket and no hash
are the same, and Redis holds only the keys being limited.

Every key of one server key carries one hash tag, so each script's keys (all passed in KEYS) hash to
one slot of a Redis Cluster. No key holds a token, a chunk or an id as it is: each is a SHA-256 digest,
and the hash tag is a digest of the server's public key.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from app.marmot.admission import Tier

# The Lua shared by the scripts: one charge of one key's two buckets.
BUCKET_LUA = """
local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function charge(key, mcap, hcap, now)
  local b = redis.call('HMGET', key, 'm', 'h', 't')
  local m, h = mcap, hcap
  if b[3] then
    local elapsed = math.max(0, now - tonumber(b[3]))
    m = math.min(mcap, tonumber(b[1]) + elapsed * mcap / 60)
    h = math.min(hcap, tonumber(b[2]) + elapsed * hcap / 3600)
  end
  if m < 1 or h < 1 then
    return 0
  end
  m, h = m - 1, h - 1
  redis.call('HSET', key, 'm', string.format('%.17g', m), 'h', string.format('%.17g', h),
    't', string.format('%.17g', now))
  local full = math.max((mcap - m) * 60 / mcap, (hcap - h) * 3600 / hcap)
  redis.call('PEXPIRE', key, math.ceil(full * 1000))
  return 1
end
"""

# Many handlers' charges in one script call: ARGV[1] the duplicate memory's lifetime (ms), ARGV[2..5]
# the chunk and device tiers' caps, then per charge its kind, its key count and (for "s") its entry;
# KEYS: each charge's keys in turn. Kind "s": KEYS a content's duplicate-memory key, then its chunks'
# buckets; {0} for a content another wrap brought before (nothing charged), else {1, 0/1 per chunk}.
# The memory holds the stream entry that set it: the same entry taken over from a process that died
# mid-way is not a duplicate of itself. Kind "d": KEYS devices' buckets; {0/1 per device}.
_CHARGES = (
    BUCKET_LUA
    + """
local now, out, k, a = now_seconds(), {}, 1, 6
while a <= #ARGV do
  local kind, n = ARGV[a], tonumber(ARGV[a + 1])
  local r = {}
  if kind == 's' then
    local holder = redis.call('GET', KEYS[k])
    if holder and holder ~= ARGV[a + 2] then
      r[1] = 0
    else
      redis.call('SET', KEYS[k], ARGV[a + 2], 'PX', ARGV[1])
      r[1] = 1
      for i = 1, n - 1 do
        r[i + 1] = charge(KEYS[k + i], tonumber(ARGV[2]), tonumber(ARGV[3]), now)
      end
    end
    a = a + 3
  else
    for i = 0, n - 1 do
      r[i + 1] = charge(KEYS[k + i], tonumber(ARGV[4]), tonumber(ARGV[5]), now)
    end
    a = a + 2
  end
  k = k + n
  out[#out + 1] = r
end
return out
"""
)


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class SharedKeys:
    """The Redis keys of one server key, all under one hash tag."""

    def __init__(self, server_public_hex: str) -> None:
        tag = hashlib.sha256(b"xmtp-push marmot " + server_public_hex.encode()).hexdigest()[:16]
        self._prefix = f"xmtp-push:marmot:{{{tag}}}:"
        self.stream = self._prefix + "wraps"
        self.global_bucket = self._prefix + "limit:global"

    def claim(self, wrap_digest: bytes) -> str:
        return self._prefix + "claim:" + wrap_digest.hex()

    def seen(self, content_digest: bytes) -> str:
        return self._prefix + "seen:" + content_digest.hex()

    def chunk(self, chunk_digest: bytes) -> str:
        return self._prefix + "limit:chunk:" + chunk_digest.hex()

    def device(self, device_digest: bytes) -> str:
        return self._prefix + "limit:device:" + device_digest.hex()


class SharedLimits:
    """The chunk and device tiers and the duplicate memory in Redis (the global tier is charged where
    a wrap is queued: app.marmot.wrap_queue). Every handler's charges go to Redis together, in one
    script call at a time. RedisError and OSError are the caller's to handle."""

    def __init__(
        self, redis: Redis, keys: SharedKeys, chunk: Tier, device: Tier, dedup_seconds: float
    ) -> None:
        self._keys = keys
        self._head = [max(1, int(dedup_seconds * 1000)), *chunk, *device]
        self._charges = redis.register_script(_CHARGES)
        self._asked: list[tuple[list[str], list[Any], asyncio.Future[list[int]]]] = []
        self._sender: asyncio.Task[None] | None = None  # the call in flight

    async def first_time_then_chunks(
        self, content: bytes, chunks: Sequence[bytes], entry: str
    ) -> list[bool] | None:
        """None when another wrap brought this content within the memory's lifetime (nothing
        charged); else whether each chunk's limit admitted it. `entry` is the wrap's stream entry."""
        keys = [self._keys.seen(digest(content)), *(self._keys.chunk(digest(chunk)) for chunk in chunks)]
        answer = await self._ask(keys, ["s", len(keys), entry])
        if not answer[0]:
            return None
        return [bool(result) for result in answer[1:]]

    async def charge_devices(self, devices: Sequence[bytes]) -> list[bool]:
        """Whether each device (platform byte + token bytes) is within its limit, charged if so."""
        if not devices:
            return []
        keys = [self._keys.device(digest(device)) for device in devices]
        return [bool(result) for result in await self._ask(keys, ["d", len(keys)])]

    def _ask(self, keys: list[str], args: list[Any]) -> asyncio.Future[list[int]]:
        """One charge, sent with the others asked for meanwhile: at once when no call is in flight,
        else as soon as it has answered (so a busy process sends fewer, larger calls)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[int]] = loop.create_future()
        if not self._asked and self._sender is None:
            loop.call_soon(self._send_asked)  # with the others asked for in this loop iteration
        self._asked.append((keys, args, answer))
        return answer

    def _send_asked(self) -> None:
        if self._sender is not None or not self._asked:
            return
        asked, self._asked = self._asked, []
        self._sender = asyncio.get_running_loop().create_task(self._send(asked))
        self._sender.add_done_callback(self._sent)

    def _sent(self, _: asyncio.Task[None]) -> None:
        self._sender = None
        self._send_asked()

    async def _send(self, asked: list[tuple[list[str], list[Any], asyncio.Future[list[int]]]]) -> None:
        keys = [key for charge in asked for key in charge[0]]
        args = self._head + [arg for charge in asked for arg in charge[1]]
        try:
            answers = await self._charges(keys, args)
        except Exception as error:  # each handler's to handle (Redis away: its own limits)
            for _, _, answer in asked:
                if not answer.done():
                    answer.set_exception(error)
            return
        for (_, _, answer), result in zip(asked, answers, strict=True):
            if not answer.done():
                answer.set_result(result)
