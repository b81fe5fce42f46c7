"""The work queue inside one process, for `xmtp-push dev` without Redis.

Same contract as the Redis version, including the reclaim of entries left
pending by a reader that stopped, and partitions (each stream exists once per
partition); nothing survives the process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.queue.base import Commit, Delayed, Entry


@dataclass(slots=True)
class _Pending:
    entry: Entry
    since: float


@dataclass(slots=True)
class _Stream:
    waiting: deque[Entry] = field(default_factory=deque)
    pending: dict[str, _Pending] = field(default_factory=dict)
    last_id: tuple[int, int] = (0, -1)  # the milliseconds and sequence of the newest entry's id


def _next_id(state: _Stream) -> str:
    """An id as Redis makes one, the milliseconds of the addition first (see `oldest`), then a
    sequence within that millisecond, per stream and partition: ids repeat across partitions, as
    they do on Redis whenever two partitions take an entry in the same millisecond."""
    last_ms, last_sequence = state.last_id
    now_ms = int(time.time() * 1000)
    state.last_id = (now_ms, 0) if now_ms > last_ms else (last_ms, last_sequence + 1)
    return f"{state.last_id[0]}-{state.last_id[1]}"


class MemoryQueue:
    def __init__(self, reclaim_seconds: float, partitions: int = 1) -> None:
        self._reclaim_seconds = reclaim_seconds
        self._partitions = partitions
        # stream -> partition -> its state
        self._streams: dict[str, dict[int, _Stream]] = {}
        self._numbers = itertools.count(1)  # orders the delayed heap
        self._delayed: list[tuple[float, int, int, Delayed]] = []  # due, number, partition, entry
        self._keyed: dict[str, tuple[int, int]] = {}  # key -> (rank, heap number) of the one waiting
        self._claims: dict[str, tuple[str, float]] = {}
        self._next_prune = 0.0
        self._changed = asyncio.Condition()

    @property
    def partitions(self) -> int:
        return self._partitions

    def _stream(self, name: str, partition: int) -> _Stream:
        return self._streams.setdefault(name, {}).setdefault(partition, _Stream())

    def _parts(self, name: str) -> list[_Stream]:
        return list(self._streams.get(name, {}).values())

    def _append(self, stream: str, payloads: Sequence[bytes], partition: int) -> None:
        state = self._stream(stream, partition)
        for payload in payloads:
            state.waiting.append(Entry(_next_id(state), payload, partition))

    async def add(self, stream: str, payloads: Sequence[bytes], partition: int = 0) -> None:
        await self.add_each(stream, {partition: payloads})

    async def add_each(self, stream: str, parts: Mapping[int, Sequence[bytes]]) -> None:
        async with self._changed:
            for partition, payloads in parts.items():
                self._append(stream, payloads, partition)
            self._changed.notify_all()

    async def read(
        self,
        stream: str,
        consumer: str,
        count: int,
        block_seconds: float,
        partitions: Sequence[int] | None = None,
    ) -> list[Entry]:
        deadline = time.monotonic() + block_seconds
        async with self._changed:
            while True:
                entries = self._take_from(stream, count, partitions)
                remaining = deadline - time.monotonic()
                if entries or remaining <= 0:
                    return entries
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    return []

    def _take_from(self, stream: str, count: int, partitions: Sequence[int] | None) -> list[Entry]:
        by_partition = self._streams.get(stream, {})
        numbers = list(by_partition) if partitions is None else partitions
        entries: list[Entry] = []
        for number in numbers:
            state = by_partition.get(number)
            if state is not None and len(entries) < count:
                entries += self._take(state, count - len(entries))
        return entries

    def _take(self, state: _Stream, count: int) -> list[Entry]:
        now = time.monotonic()
        stale = [p for p in state.pending.values() if now - p.since >= self._reclaim_seconds][:count]
        entries = [p.entry for p in stale]
        while state.waiting and len(entries) < count:
            entries.append(state.waiting.popleft())
        for entry in entries:
            state.pending[entry.id] = _Pending(entry, now)
        return entries

    async def commit(self, stream: str, commit: Commit) -> None:
        await self.commit_each(stream, [commit])

    async def commit_each(self, stream: str, commits: Sequence[Commit]) -> None:
        async with self._changed:
            for commit in commits:
                self._apply(stream, commit)
            self._changed.notify_all()

    def _apply(self, stream: str, commit: Commit) -> None:
        pending = self._stream(stream, commit.partition).pending
        acknowledged = [entry_id for entry_id in commit.ack if pending.pop(entry_id, None) is not None]
        if commit.ack and not acknowledged:
            return  # every entry acknowledged already, with this follow-up work: as the Redis script
        for target, payloads in commit.add.items():
            self._append(target, payloads, commit.partition)
        for delayed in commit.delay:
            self._push_delayed(delayed, commit.partition)

    def _push_delayed(self, delayed: Delayed, partition: int) -> None:
        number = next(self._numbers)
        if delayed.key:
            waiting = self._keyed.get(delayed.key)
            if waiting is not None and waiting[0] > delayed.rank:
                return  # a newer one waits already
            self._keyed[delayed.key] = (delayed.rank, number)  # the older one is skipped when due
        heapq.heappush(self._delayed, (delayed.due, number, partition, delayed))

    def _superseded(self, number: int, delayed: Delayed) -> bool:
        """A keyed entry that is no longer its key's one waiting (replaced, or its key went out)."""
        return bool(delayed.key) and self._keyed.get(delayed.key, (0, 0))[1] != number

    async def promote_due(self, now: float, limit: int, partitions: Sequence[int] | None = None) -> int:
        # One heap for every partition: a worker reading a share promotes the share's, and puts
        # back the others' it met on the way.
        moved, others = 0, []
        chosen = None if partitions is None else set(partitions)
        async with self._changed:
            while self._delayed and self._delayed[0][0] <= now and moved < limit:
                item = heapq.heappop(self._delayed)
                _, number, partition, delayed = item
                if self._superseded(number, delayed):
                    continue
                if chosen is not None and partition not in chosen:
                    others.append(item)
                    continue
                self._keyed.pop(delayed.key, None)
                self._append(delayed.stream, [delayed.payload], partition)
                moved += 1
            for item in others:
                heapq.heappush(self._delayed, item)
            if moved:
                self._changed.notify_all()
        return moved

    async def claim_once(
        self, claims: Sequence[tuple[str, str]], ttl_seconds: int, partition: int = 0
    ) -> list[bool]:
        now = time.monotonic()
        results = []
        for name, owner in claims:
            key = f"{partition}:{name}"
            holder = self._claims.get(key)
            if holder is None or holder[1] <= now:
                self._claims[key] = (owner, now + ttl_seconds)
                holder = self._claims[key]
            results.append(holder[0] == owner)
        if now >= self._next_prune:
            self._claims = {k: v for k, v in self._claims.items() if v[1] > now}
            self._next_prune = now + 60
        return results

    async def depth(self, stream: str) -> int:
        return sum(len(state.waiting) + len(state.pending) for state in self._parts(stream))

    async def oldest(self, stream: str) -> float | None:
        ids = []
        for state in self._parts(stream):
            ids += [state.waiting[0].id] if state.waiting else []
            ids += list(state.pending)
        return min((int(i.partition("-")[0]) / 1000 for i in ids), default=None)

    async def delayed_count(self) -> int:
        return sum(1 for _, number, _, delayed in self._delayed if not self._superseded(number, delayed))

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        return 0  # consumers are not named in this process's queue

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
