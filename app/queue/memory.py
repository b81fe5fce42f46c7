"""The work queue inside one process, for `xmtp-push dev` without Redis.

Same contract as the Redis version, including the reclaim of entries left
pending by a reader that stopped; nothing survives the process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Sequence
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


class MemoryQueue:
    def __init__(self, reclaim_seconds: float) -> None:
        self._reclaim_seconds = reclaim_seconds
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count(1)
        self._delayed: list[tuple[float, int, Delayed]] = []
        self._keyed: dict[str, tuple[int, int]] = {}  # key -> (rank, heap number) of the one waiting
        self._claims: dict[str, tuple[str, float]] = {}
        self._next_prune = 0.0
        self._changed = asyncio.Condition()

    def _stream(self, name: str) -> _Stream:
        return self._streams.setdefault(name, _Stream())

    def _append(self, stream: str, payloads: Sequence[bytes]) -> None:
        waiting = self._stream(stream).waiting
        # Ids as Redis makes them, the milliseconds of the addition first (see `oldest`).
        added = int(time.time() * 1000)
        waiting.extend(Entry(f"{added}-{next(self._ids)}", payload) for payload in payloads)

    async def add(self, stream: str, payloads: Sequence[bytes]) -> None:
        async with self._changed:
            self._append(stream, payloads)
            self._changed.notify_all()

    async def read(self, stream: str, consumer: str, count: int, block_seconds: float) -> list[Entry]:
        deadline = time.monotonic() + block_seconds
        async with self._changed:
            while True:
                entries = self._take(self._stream(stream), count)
                remaining = deadline - time.monotonic()
                if entries or remaining <= 0:
                    return entries
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    return []

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
        async with self._changed:
            pending = self._stream(stream).pending
            for entry_id in commit.ack:
                pending.pop(entry_id, None)
            for target, payloads in commit.add.items():
                self._append(target, payloads)
            for delayed in commit.delay:
                self._push_delayed(delayed)
            self._changed.notify_all()

    def _push_delayed(self, delayed: Delayed) -> None:
        number = next(self._ids)
        if delayed.key:
            waiting = self._keyed.get(delayed.key)
            if waiting is not None and waiting[0] > delayed.rank:
                return  # a newer one waits already
            self._keyed[delayed.key] = (delayed.rank, number)  # the older one is skipped when due
        heapq.heappush(self._delayed, (delayed.due, number, delayed))

    def _superseded(self, number: int, delayed: Delayed) -> bool:
        """A keyed entry that is no longer its key's one waiting (replaced, or its key went out)."""
        return bool(delayed.key) and self._keyed.get(delayed.key, (0, 0))[1] != number

    async def promote_due(self, now: float, limit: int) -> int:
        moved = 0
        async with self._changed:
            while self._delayed and self._delayed[0][0] <= now and moved < limit:
                _, number, delayed = heapq.heappop(self._delayed)
                if self._superseded(number, delayed):
                    continue
                self._keyed.pop(delayed.key, None)
                self._append(delayed.stream, [delayed.payload])
                moved += 1
            if moved:
                self._changed.notify_all()
        return moved

    async def claim_once(self, claims: Sequence[tuple[str, str]], ttl_seconds: int) -> list[bool]:
        now = time.monotonic()
        results = []
        for key, owner in claims:
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
        state = self._stream(stream)
        return len(state.waiting) + len(state.pending)

    async def oldest(self, stream: str) -> float | None:
        state = self._stream(stream)
        ids = [state.waiting[0].id] if state.waiting else []
        ids += list(state.pending)
        return min((int(i.partition("-")[0]) / 1000 for i in ids), default=None)

    async def delayed_count(self) -> int:
        return sum(1 for _, number, delayed in self._delayed if not self._superseded(number, delayed))

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        return 0  # consumers are not named in this process's queue

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
