"""Which queue partitions each worker reads: heartbeats in Redis and rendezvous hashing.

Every worker process is a member: it writes its own deadline (Redis's clock plus the lease) into one
hash at every beat and reads the whole membership back, dropping members whose deadline passed, in
one script. Each partition belongs to the live member with the highest hash of (member, partition),
so every member that sees the same membership computes the same owners, a joining member takes about
1/N of the partitions, and a leaving one's partitions spread over the others.

Why no partition goes unread: a member reads every partition it computes as its own from its latest
view, and it counts itself in every view. A partition can lack a reader only while some member's view
still holds a member that is gone; that view is at most one beat old, and the gone member leaves every
view once its lease ends (at once, when it stops cleanly and says so). So a dead worker's partitions
are read again within the lease (`XMTP_PUSH_QUEUE_RECLAIM_SECONDS`), and its pending entries, idle
that long, are then reclaimed by the new owner. Views that differ for a moment only make two members
read one partition, which the consumer group makes harmless (each entry goes to one reader).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from app.queue.redis_link import RedisLink

MEMBERS_KEY = "{xmtp-push:members}:workers"
# A member beats this many times per lease: a view is never older than lease / BEATS_PER_LEASE.
BEATS_PER_LEASE = 4

# KEYS: the membership hash. ARGV: this member, its lease in ms, then 1 to join or 0 to leave.
# Deadlines are Redis's own clock (TIME), so members on machines whose clocks differ agree.
_BEAT = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], now_ms + tonumber(ARGV[2]))
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local live = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < now_ms then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live[#live + 1] = all[i]
  end
end
return live
"""


def rank(member: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{member}\n{partition}".encode(), digest_size=8).digest()


def owners(members: Iterable[str], partitions: int) -> dict[int, str]:
    """The owner of every partition among `members` (rendezvous hashing)."""
    live = sorted(set(members))
    if not live:
        return {}
    return {p: max(live, key=lambda member: rank(member, p)) for p in range(partitions)}


def owned_by(member: str, members: Iterable[str], partitions: int) -> frozenset[int]:
    return frozenset(p for p, owner in owners([member, *members], partitions).items() if owner == member)


class PartitionOwnership:
    """One worker process's membership and the partitions it reads."""

    def __init__(self, link: RedisLink, member: str, partitions: int, lease_seconds: float) -> None:
        self._link = link
        self.member = member
        self.partitions = partitions
        self.lease_ms = max(1000, int(lease_seconds * 1000))
        self.members: tuple[str, ...] = (member,)
        # Until the first beat, a member reads everything: a lone worker starts at once.
        self.owned: frozenset[int] = frozenset(range(partitions))

    @property
    def beat_seconds(self) -> float:
        return self.lease_ms / 1000 / BEATS_PER_LEASE

    async def beat(self) -> frozenset[int]:
        """Renew this member's lease and recompute its partitions from the live membership."""
        live = await self._call(join=True)
        self._update([_text(m) for m in live])
        return self.owned

    async def leave(self) -> None:
        """Stopped cleanly: its partitions go to the others at their next beat, not after the lease."""
        await self._call(join=False)

    async def _call(self, *, join: bool) -> Any:
        args = (self.member, self.lease_ms, 1 if join else 0)
        return await self._link.run(lambda client: client.eval(_BEAT, 1, MEMBERS_KEY, *args))

    def _update(self, live: Sequence[str]) -> None:
        self.members = tuple(sorted(set(live) | {self.member}))
        self.owned = owned_by(self.member, self.members, self.partitions)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
