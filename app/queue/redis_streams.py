"""The work queue on Redis Streams: one consumer group shared by every worker process.

Entries carry one field, `p`, the payload. Acknowledged entries are deleted,
so a stream's length is its depth. Delayed retries wait in a sorted set scored
by due time and are moved onto their stream by a script, atomically.

Every key of partition p carries the hash tag `{p<p>}` (`redis_calls.py`): `xmtp-push:{p7}:envelopes`,
`xmtp-push:{p7}:deliveries.http`, `xmtp-push:{p7}:delayed`, `xmtp-push:{p7}:claim:<key>`,
`xmtp-push:{p7}:delayed-key:<key>`. A script call only ever touches one partition's keys, so it
runs on a single Redis and on a Redis Cluster alike (where the partitions spread over the
primaries). `xmtp-push:partitions` records the count the queue was made with.

Reading many partitions takes no blocking connection per partition: a read sends one
non-blocking XREADGROUP per partition (in a script, `READ`) in one pipeline (on a cluster, one per node), and waits a
moment when all are empty. What it takes beyond what the caller asked for stays, pending to this
process, in a buffer per stream that the process's next reads of the stream take first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from app.queue.base import Commit, Entry, PartitionCountMismatch
from app.queue.doorbell import Doorbell
from app.queue.kept import KeptWatch, warn_if_not_kept
from app.queue.redis_calls import (
    ADD,
    CLAIM,
    GONE,
    GROUP,
    GROUP_NAME,
    PREFIX,
    commit_call,
    delayed_key,
    packed,
    promote_call,
    read_call,
    stream_key,
    tag,
)
from app.queue.redis_link import TRANSIENT, ClusterMode, RedisLink
from app.queue.redis_scripts import Call, run_calls

FIELD = b"p"
PARTITIONS_KEY = PREFIX + "partitions"
# A read that found every partition empty looks again after a pause that grows from the first to
# the last figure while the stream stays empty (an idle worker sends a few pipelines a second, and a
# hint on an idle stream waits at most the longest pause more than behind a blocking read). Work this
# process adds (fan-out adding delivery jobs) ends the pause of its own readers at once.
IDLE_POLL_SECONDS = (0.005, 0.2)
PARTITIONS_SETTING = "XMTP_PUSH_QUEUE_PARTITIONS"


@dataclass(slots=True)
class _Feed:
    """One stream's entries read by this process and not yet handed out, with when each was read."""

    entries: deque[tuple[Entry, float]] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    quiet_until: float = 0.0
    pause: float = 0.0  # the last idle pause; 0 after a read that found entries
    last_reclaim: float = 0.0
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def found(self, anything: bool, now: float) -> None:
        if anything:
            self.pause = 0.0
            return
        first, longest = IDLE_POLL_SECONDS
        self.pause = min(longest, max(first, self.pause * 2))
        self.quiet_until = now + self.pause

    def wake(self) -> None:
        self.quiet_until = self.pause = 0.0
        self.woken.set()

    async def rest(self, seconds: float) -> None:
        """Wait up to `seconds`; work this process adds to the stream ends the wait at once."""
        self.woken.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.woken.wait(), seconds)


class RedisQueue:
    def __init__(self, link: RedisLink, reclaim_seconds: float, partitions: int) -> None:
        self._link = link
        self._reclaim_seconds = reclaim_seconds
        self._reclaim_ms = max(1, int(reclaim_seconds * 1000))
        self._partitions = partitions
        self._all = tuple(range(partitions))
        self._groups: set[str] = set()
        self._feeds: dict[str, _Feed] = {}
        self._doorbell = Doorbell(link, self._wake)
        self._kept = KeptWatch(self._all)
        self._looking: asyncio.Task[None] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        reclaim_seconds: float,
        partitions: int = 64,
        cluster: ClusterMode = "auto",
        max_connections: int = 64,
    ) -> RedisQueue:
        queue: RedisQueue
        link = RedisLink(
            url,
            cluster,
            max_connections,
            on_connect=lambda c: queue._connected(c),
            on_recover=lambda: queue._recovered(),
        )
        queue = cls(link, reclaim_seconds, partitions)
        return queue

    @property
    def link(self) -> RedisLink:
        return self._link

    @property
    def partitions(self) -> int:
        return self._partitions

    async def start(self) -> None:
        """Connect now, so that a partition count other than the queue's stops start-up; a Redis
        that does not answer yet is left to the readiness probe."""
        with contextlib.suppress(*TRANSIENT):
            await self._link.client()

    async def _connected(self, client: Any) -> None:
        await self._check_partitions(client)
        await warn_if_not_kept(client)
        await self._kept.look(client)

    def _recovered(self) -> None:
        """Redis serves again after an outage: did it keep the queue? (Looked at aside, once at a time.)"""
        if self._looking is None or self._looking.done():
            self._looking = asyncio.create_task(self._look_again())

    async def _look_again(self) -> None:
        with contextlib.suppress(Exception):  # an outage again: the next recovery looks
            await self._link.run(self._kept.look, retry=False)

    async def _check_partitions(self, client: Any) -> None:
        await client.set(PARTITIONS_KEY, self._partitions, nx=True)
        recorded = int(await client.get(PARTITIONS_KEY))
        if recorded != self._partitions:
            raise PartitionCountMismatch(
                f"{PARTITIONS_SETTING}: the queue in Redis has {recorded} partitions, this process"
                f" {self._partitions}; start it with {recorded}, or change the count only once the"
                " queue is drained"
            )

    # ---- adding ----------------------------------------------------------------------------------

    async def add(self, stream: str, payloads: Sequence[bytes], partition: int = 0) -> None:
        await self.add_each(stream, {partition: payloads})

    async def add_each(self, stream: str, parts: Mapping[int, Sequence[bytes]]) -> None:
        calls = [
            Call(ADD, [stream_key(stream, p)], packed(payloads)) for p, payloads in parts.items() if payloads
        ]
        if calls:
            await self._link.run(lambda client: run_calls(client, calls))
            await self._added({stream})

    async def _added(self, streams: Collection[str]) -> None:
        """Wake the readers of `streams`: this process's at once, the others' through the doorbell."""
        self._wake(streams)
        await self._doorbell.ring(streams)

    def _wake(self, streams: Collection[str] | None) -> None:
        """This process's readers of `streams` (None: of every stream) stop resting."""
        for stream in self._feeds if streams is None else streams:
            if (feed := self._feeds.get(stream)) is not None:
                feed.wake()

    # ---- reading ---------------------------------------------------------------------------------

    async def read(
        self,
        stream: str,
        consumer: str,
        count: int,
        block_seconds: float,
        partitions: Sequence[int] | None = None,
    ) -> list[Entry]:
        feed = self._feeds.setdefault(stream, _Feed())
        self._doorbell.listen()
        parts = self._all if partitions is None else tuple(partitions)
        deadline = time.monotonic() + block_seconds
        while True:
            if entries := self._take(feed, count):
                return entries
            async with feed.lock:
                if not feed.entries and time.monotonic() >= feed.quiet_until:
                    await self._fill(feed, stream, consumer, count, parts)
            if feed.entries:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await feed.rest(min(remaining, max(0.001, feed.quiet_until - time.monotonic())))

    def _take(self, feed: _Feed, count: int) -> list[Entry]:
        # An entry kept here for half the reclaim period may be reclaimed by another reader soon:
        # it is left to them rather than handled twice.
        stale = time.monotonic() - self._reclaim_seconds / 2
        entries: list[Entry] = []
        while feed.entries and len(entries) < count:
            entry, read_at = feed.entries.popleft()
            if read_at >= stale:
                entries.append(entry)
        return entries

    async def _fill(
        self, feed: _Feed, stream: str, consumer: str, count: int, parts: tuple[int, ...]
    ) -> None:
        keys = [stream_key(stream, p) for p in parts]
        entries = await self._link.run(lambda client: self._poll(client, feed, keys, parts, consumer, count))
        now = time.monotonic()
        feed.entries.extend((entry, now) for entry in entries)
        feed.found(bool(entries), now)

    async def _poll(
        self, client: Any, feed: _Feed, keys: list[str], parts: tuple[int, ...], consumer: str, count: int
    ) -> list[Entry]:
        await self._ensure_groups(client, keys)
        entries = await self._reclaim(client, feed, keys, parts, consumer, count)
        replies = await run_calls(client, [read_call(key, consumer, count) for key in keys])
        for key, partition, reply in zip(keys, parts, replies, strict=True):
            if reply == GONE:  # a Redis restarted without its data, a deleted key: made again next read
                self._groups.discard(key)
            elif reply:
                entries.extend(_read_entries(reply[0][1], partition))
        return entries

    def _gone(self, key: str, reply: Any) -> bool:
        """Whether a reply is an error; the stream and its group vanished under us (a Redis restarted
        without its data, a deleted key): forget the group so the next read creates it again."""
        if not isinstance(reply, Exception):
            return False
        if isinstance(reply, ResponseError) and str(reply).startswith("NOGROUP"):
            self._groups.discard(key)
            return True
        raise reply

    async def _ensure_groups(self, client: Any, keys: list[str]) -> None:
        missing = [key for key in keys if key not in self._groups]
        if not missing:
            return
        pipe = client.pipeline(transaction=False)
        for key in missing:
            # From the start, so entries added before any worker existed are read.
            pipe.execute_command("XGROUP", "CREATE", key, GROUP, "0", "MKSTREAM")
        for key, reply in zip(missing, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply
            self._groups.add(key)

    async def _reclaim(
        self, client: Any, feed: _Feed, keys: list[str], parts: tuple[int, ...], consumer: str, count: int
    ) -> list[Entry]:
        # XAUTOCLAIM scans the pending list; a few times per reclaim period is enough.
        now = time.monotonic()
        if now - feed.last_reclaim < self._reclaim_ms / 4000:
            return []
        feed.last_reclaim = now
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.xautoclaim(key, GROUP, consumer, self._reclaim_ms, "0-0", count=count)
        entries: list[Entry] = []
        for key, partition, reply in zip(keys, parts, await pipe.execute(raise_on_error=False), strict=True):
            if not self._gone(key, reply):
                entries.extend(_entries(reply[1], partition))
        return entries

    # ---- committing ------------------------------------------------------------------------------

    async def commit(self, stream: str, commit: Commit) -> None:
        await self.commit_each(stream, [commit])

    async def commit_each(self, stream: str, commits: Sequence[Commit]) -> None:
        calls = [commit_call(stream, commit) for commit in commits if commit]
        if calls:
            await self._link.run(lambda client: run_calls(client, calls))
            await self._added(
                {target for commit in commits for target, payloads in commit.add.items() if payloads}
            )

    async def promote_due(self, now: float, limit: int, partitions: Sequence[int] | None = None) -> int:
        parts = self._all if partitions is None else tuple(partitions)
        moved, streams = await self._link.run(lambda client: self._promote(client, now, limit, parts))
        await self._added(streams)
        return moved

    async def _promote(
        self, client: Any, now: float, limit: int, parts: tuple[int, ...]
    ) -> tuple[int, set[str]]:
        pipe = client.pipeline(transaction=False)
        for p in parts:
            pipe.zrangebyscore(delayed_key(p), "-inf", now, start=0, num=limit, withscores=True)
        due = [
            (score, p, member)
            for p, members in zip(parts, await pipe.execute(), strict=True)
            for member, score in members
        ]
        due.sort()
        by_partition: dict[int, list[bytes]] = {}
        for _, p, member in due[:limit]:
            by_partition.setdefault(p, []).append(member)
        calls = [promote_call(p, members) for p, members in by_partition.items()]
        if not calls:
            return 0, set()
        moved = sum(int(moved) for moved in await run_calls(client, calls))
        return moved, {_text(member.partition(b"\n")[0]) for _, _, member in due[:limit]}

    async def claim_once(
        self, claims: Sequence[tuple[str, str]], ttl_seconds: int, partition: int = 0
    ) -> list[bool]:
        if not claims:
            return []
        keys = [f"{tag(partition)}claim:{key}" for key, _ in claims]
        args = [ttl_seconds, *packed([owner.encode() for _, owner in claims])]
        [reply] = await self._link.run(lambda client: run_calls(client, [Call(CLAIM, keys, args)]))
        return [flag == 49 for flag in reply]  # b"1"

    # ---- looking -------------------------------------------------------------------------------

    async def _each_partition(self, command: str, *args: Any, key: str = "") -> list[Any]:
        """One command per partition's key (`key`: a stream name; empty: the delayed set), pipelined;
        once, without retries: these only report."""

        async def call(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for p in self._all:
                pipe.execute_command(command, stream_key(key, p) if key else delayed_key(p), *args)
            return list(await pipe.execute())

        return await self._link.run(call, retry=False)

    async def depth(self, stream: str) -> int:
        return sum(int(n) for n in await self._each_partition("XLEN", key=stream))

    async def oldest(self, stream: str) -> float | None:
        # Acknowledged entries are deleted, so the first one left is the oldest waiting or in flight;
        # its id starts with the milliseconds at which it was added.
        firsts = await self._each_partition("XRANGE", "-", "+", "COUNT", 1, key=stream)
        added = [int(_text(first[0][0]).partition("-")[0]) for first in firsts if first]
        return min(added) / 1000 if added else None

    async def delayed_count(self) -> int:
        return sum(int(n) for n in await self._each_partition("ZCARD"))

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        keys = [stream_key(stream, p) for p in self._all]

        async def call(client: Any) -> int:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.xinfo_consumers(key, GROUP_NAME)
            retired = client.pipeline(transaction=False)
            for key, consumers in zip(keys, await pipe.execute(raise_on_error=False), strict=True):
                if isinstance(consumers, Exception):  # no such stream or group yet
                    continue
                for consumer in consumers:
                    name = _text(consumer["name"])
                    idle = int(consumer["idle"]) / 1000
                    if consumer["pending"] == 0 and (name in names or idle > idle_seconds):
                        retired.xgroup_delconsumer(key, GROUP_NAME, name)  # answers its pending: 0
            return len(await retired.execute())

        return await self._link.run(call, retry=False)

    async def ping(self) -> bool:
        try:
            return bool(await self._link.run(lambda client: client.ping(), retry=False))
        except Exception:
            return False

    async def close(self) -> None:
        if self._looking is not None:
            self._looking.cancel()
            await asyncio.gather(self._looking, return_exceptions=True)
        await self._doorbell.close()
        await self._link.close()


def _read_entries(raw: Any, partition: int) -> list[Entry]:
    """XREADGROUP's entries as READ returns them: [id, [field, value, ...]]."""
    entries = []
    for entry_id, fields in raw:
        if fields:
            payload = fields[FIELD] if isinstance(fields, dict) else _payload_of(fields)
            entries.append(Entry(_text(entry_id), payload, partition))
    return entries


def _payload_of(fields: list[bytes]) -> bytes:
    if fields[0] == FIELD:  # the only field every entry is written with
        return fields[1]
    return dict(zip(fields[::2], fields[1::2], strict=True))[FIELD]


def _entries(raw: Any, partition: int) -> list[Entry]:
    entries = []
    for entry_id, fields in raw:
        if fields:  # an entry deleted while pending comes back without fields
            entries.append(Entry(_text(entry_id), fields[FIELD], partition))
    return entries


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
