"""The work queue every worker shares: named streams with at-least-once delivery.

An entry read from a stream stays pending until it is acknowledged; one whose
reader died is handed to another reader once it has been idle for the reclaim
period. `commit` acknowledges entries and adds their follow-up work (entries on
other streams, delayed retries) in one atomic step, so a crash between the two
can only repeat work, never lose it. Redis Streams implement it for
deployments; an in-process version serves `xmtp-push dev` without Redis.

Work is split into a fixed number of partitions. Every stream exists once per
partition, and the follow-up work of an entry stays in the entry's partition:
a commit touches one partition only, which is what lets Redis Cluster run it as
one script (all its keys share the partition's hash tag). What must stay
together chooses the partition: a topic, for its envelopes, their delivery jobs
and their retries (coalesced by recipient and topic).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.core.channels import Channel

ENVELOPES = "envelopes"
MAX_PARTITIONS = 16384  # Redis Cluster's slot count: more partitions could not spread further


def delivery_stream(channel: Channel) -> str:
    return f"deliveries.{channel}"


def partition_of(routing: bytes, partitions: int) -> int:
    """The partition of the work routed by `routing` (a topic): stable across processes and versions."""
    return zlib.crc32(routing) % partitions


class PartitionCountMismatch(Exception):
    """The queue in Redis was made with another partition count than this process's."""


@dataclass(frozen=True, slots=True)
class Entry:
    """An entry read from a stream. Its id is unique within its partition only: partitions added to
    in the same millisecond number their entries alike, so an entry is `(partition, id)`."""

    id: str
    payload: bytes
    partition: int = 0


@dataclass(frozen=True, slots=True)
class Delayed:
    stream: str
    payload: bytes
    due: float  # Unix seconds
    # Among delayed entries with one key, only the highest rank waits: a newer one replaces an
    # older one, and an older one arriving late is dropped. "" keys nothing.
    key: str = ""
    rank: int = 0


@dataclass(slots=True)
class Commit:
    """Follow-up work of handled entries of one partition, applied together with their
    acknowledgement; the additions and delays go to the same partition."""

    ack: list[str] = field(default_factory=list)
    add: dict[str, list[bytes]] = field(default_factory=dict)
    delay: list[Delayed] = field(default_factory=list)
    partition: int = 0

    def add_to(self, stream: str, payload: bytes) -> None:
        self.add.setdefault(stream, []).append(payload)

    def __bool__(self) -> bool:
        return bool(self.ack or self.add or self.delay)


@dataclass(slots=True)
class Unsent:
    """Commits that failed (Redis failing over), sent again before newer ones: once Redis serves,
    they land before their entries are reclaimed and handled a second time. At most `limit`
    acknowledgements are kept; older commits are left to the reclaim (at-least-once either way)."""

    limit: int
    commits: list[Commit] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.commits)

    def take(self, newer: Sequence[Commit]) -> list[Commit]:
        """The kept commits, then `newer`; none is kept any more."""
        commits, self.commits = [*self.commits, *newer], []
        return commits

    def keep(self, commits: Sequence[Commit]) -> None:
        """Keep `commits`, which failed, for the next send: the newest of them, within the limit."""
        kept, acks = [], 0
        for commit in reversed(commits):
            acks += len(commit.ack)
            if acks > self.limit:
                break
            kept.append(commit)
        self.commits = kept[::-1]


@dataclass(slots=True)
class Share:
    """The partitions a worker reads. Every reader looks at `partitions` on each read, so whoever
    decides a worker's share may change it while the worker runs."""

    partitions: tuple[int, ...]

    @classmethod
    def everything(cls, count: int) -> Share:
        return cls(tuple(range(count)))


class WorkQueue(Protocol):
    @property
    def partitions(self) -> int:
        """How many partitions the work is split into."""

    async def add(self, stream: str, payloads: Sequence[bytes], partition: int = 0) -> None:
        """Append entries to one partition's stream, all or none."""

    async def add_each(self, stream: str, parts: Mapping[int, Sequence[bytes]]) -> None:
        """Append entries to several partitions' streams: each partition's all or none."""

    async def read(
        self,
        stream: str,
        consumer: str,
        count: int,
        block_seconds: float,
        partitions: Sequence[int] | None = None,
    ) -> list[Entry]:
        """Up to `count` entries of the given partitions (None: all): reclaimed stale ones first,
        then new ones (waits up to block_seconds)."""

    async def commit(self, stream: str, commit: Commit) -> None:
        """Acknowledge `commit.ack` on `stream` and apply its additions and delays atomically. A
        commit whose entries are all acknowledged already applies nothing: one that failed, or
        whose answer was lost, may be sent again."""

    async def commit_each(self, stream: str, commits: Sequence[Commit]) -> None:
        """Several commits (of different partitions, or several of one), each atomic, sent together."""

    async def promote_due(self, now: float, limit: int, partitions: Sequence[int] | None = None) -> int:
        """Move delayed entries that are due onto their streams; returns how many."""

    async def claim_once(
        self, claims: Sequence[tuple[str, str]], ttl_seconds: int, partition: int = 0
    ) -> list[bool]:
        """Per (key, owner): True if the key was free (now held by owner) or is held by that owner.
        Keys and owners are the partition's own: the same key in another partition is another claim."""

    async def depth(self, stream: str) -> int:
        """Entries on the stream (all partitions) not yet acknowledged (waiting or in flight)."""

    async def oldest(self, stream: str) -> float | None:
        """When (Unix seconds) the stream's oldest entry not yet acknowledged was added; None if empty."""

    async def delayed_count(self) -> int: ...

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        """Remove the stream's consumers that hold no entries and are in `names` or idle longer
        than `idle_seconds` (a worker that stopped, or died and was taken over); how many."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
