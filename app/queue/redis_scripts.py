"""The queue's Lua scripts, and how they are sent: by their SHA in pipelines, loaded after NOSCRIPT.

Every key a script touches is in KEYS, and all of one call's keys carry one partition's hash tag,
so Redis Cluster runs each call on the primary holding that partition. No script builds a key.

Many values travel as two arguments, their lengths ("12,15,...") and their bytes run together,
which `split` cuts apart: packing one argument per value cost the client more than Redis spends
on the commands. Binary-safe, as every payload may be any bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

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

# KEYS: the stream. ARGV: its payloads, packed.
ADD = _ADD_ALL + "add_all(KEYS[1], ARGV[1], ARGV[2])\nreturn 1\n"

# KEYS: the delayed set, then the streams its members go to. ARGV: the members (packed) and, per
# member, the KEYS index of its stream. A member is "stream\npayload"; one another promoter took
# meanwhile is no longer in the set and is skipped, so each is added once.
PROMOTE = (
    _SPLIT
    + """
local members = split(ARGV[1], ARGV[2])
local moved, i = 0, 0
for index in string.gmatch(ARGV[3], '%d+') do
  i = i + 1
  local member = members[i]
  if redis.call('ZREM', KEYS[1], member) == 1 then
    local sep = string.find(member, '\\n', 1, true)
    redis.call('XADD', KEYS[tonumber(index)], '*', 'p', string.sub(member, sep + 1))
    moved = moved + 1
  end
end
return moved
"""
)

# KEYS: the stream. ARGV: group, consumer, count. New entries for the consumer as XREADGROUP sends
# them; -1 when the stream or its group is gone. A script, not the command itself: a cluster client
# asks a node for XREADGROUP's keys (COMMAND GETKEYS, a round trip per partition read) but finds a
# script's keys in the call.
READ = """
local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
if type(reply) == 'table' and reply.err then
  if string.sub(reply.err, 1, 7) == 'NOGROUP' then return -1 end
  return reply
end
return reply
"""

# KEYS: the claim keys. ARGV: the ttl, then the owners (packed). The reply is one string of
# "1"/"0" flags.
CLAIM = (
    _SPLIT
    + """
local owners = split(ARGV[2], ARGV[3])
local ttl = tonumber(ARGV[1])
local flags = {}
for i, key in ipairs(KEYS) do
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

# A keyed delay replaces the one its key holds unless that one ranks higher (then it is dropped).
# The key's holder is a string "rank\nmember" that expires once the delay is long due.
_DELAY = """
local function delay(set, score, member, key, rank, ttl)
  if key then
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
# KEYS: the acknowledged stream, the delayed set, the streams that get additions, then the delays'
# coalescing keys. ARGV: group; the count of addition streams, then per stream its lengths and
# payloads; the delay count, then (score, member, KEYS index of its key or 0, rank, ttl) for each;
# the ack count, then the ids. The acknowledgements come first: a commit whose entries were all
# acknowledged already (it landed, and its answer was lost in a failover; or a worker sends again one
# that failed) adds and delays nothing a second time. Only a commit acknowledges, always with the
# entries' follow-up work, so nothing is dropped that was not added then. XDEL comes last.
COMMIT = (
    _ADD_ALL
    + _DELAY
    + """
local streams = tonumber(ARGV[2])
local delays_at = 3 + 2 * streams
local acks_at = delays_at + 1 + 5 * tonumber(ARGV[delays_at])
local acks = tonumber(ARGV[acks_at])
local chunks = {}  -- the ids a thousand at a time: unpack fails past Lua's stack limit (about 8,000)
for first = 0, acks - 1, 1000 do
  local ids = {}
  for j = 1, math.min(1000, acks - first) do ids[j] = ARGV[acks_at + first + j] end
  chunks[#chunks + 1] = ids
end
local acknowledged = 0
for _, ids in ipairs(chunks) do
  acknowledged = acknowledged + redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
end
if acks == 0 or acknowledged > 0 then
  local a = 3
  for k = 1, streams do
    add_all(KEYS[2 + k], ARGV[a], ARGV[a + 1]); a = a + 2
  end
  a = delays_at + 1
  for _ = 1, tonumber(ARGV[delays_at]) do
    local index = tonumber(ARGV[a + 2])
    local key = false
    if index > 0 then key = KEYS[index] end
    delay(KEYS[2], ARGV[a], ARGV[a + 1], key, tonumber(ARGV[a + 3]), ARGV[a + 4]); a = a + 5
  end
end
for _, ids in ipairs(chunks) do redis.call('XDEL', KEYS[1], unpack(ids)) end
return acknowledged
"""
)


@dataclass(frozen=True, slots=True)
class Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest())


@dataclass(frozen=True, slots=True)
class Call:
    script: Script
    keys: Sequence[Any]
    args: Sequence[Any]


async def run_calls(client: Any, calls: Sequence[Call]) -> list[Any]:
    """Every call's reply, in order, sent in one pipeline (on a cluster, one per node); a script a
    server does not know (restarted, or a replica just promoted) is loaded and its calls sent again.
    Raises the first error other than NOSCRIPT."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(3):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            call = calls[i]
            # As a plain command: the cluster pipeline refuses its evalsha method, not the command.
            pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        results = await pipe.execute(raise_on_error=False)
        missing = []
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, NoScriptError):
                missing.append(i)
            elif isinstance(result, Exception):
                raise result
            else:
                replies[i] = result
        if not missing:
            return replies
        for source in {calls[i].script.source for i in missing}:
            await client.script_load(source)
        todo = missing
    raise NoScriptError("scripts could not be loaded")
