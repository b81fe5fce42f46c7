"""The work queue every worker shares: named streams with at-least-once delivery.

An entry read from a stream stays pending until it is acknowledged; one whose
reader died is handed to another reader once it has been idle for the reclaim
period. `commit` acknowledges entries and adds their follow-up work (entries on
other streams, delayed retries) in one atomic step, so a crash between the two
can only repeat work, never lose it. Redis Streams implement it for
deployments; an in-process version serves `xmtp-push dev` without Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

ENVELOPES = "envelopes"


def delivery_stream(channel: str) -> str:
    return f"deliveries.{channel}"


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    payload: bytes


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
    """Follow-up work of handled entries, applied together with their acknowledgement."""

    ack: list[str] = field(default_factory=list)
    add: dict[str, list[bytes]] = field(default_factory=dict)
    delay: list[Delayed] = field(default_factory=list)

    def add_to(self, stream: str, payload: bytes) -> None:
        self.add.setdefault(stream, []).append(payload)

    def __bool__(self) -> bool:
        return bool(self.ack or self.add or self.delay)


class WorkQueue(Protocol):
    async def add(self, stream: str, payloads: Sequence[bytes]) -> None:
        """Append entries, all or none."""

    async def read(self, stream: str, consumer: str, count: int, block_seconds: float) -> list[Entry]:
        """Up to `count` entries: reclaimed stale ones first, then new ones (waits up to block_seconds)."""

    async def commit(self, stream: str, commit: Commit) -> None:
        """Acknowledge `commit.ack` on `stream` and apply its additions and delays atomically."""

    async def promote_due(self, now: float, limit: int) -> int:
        """Move delayed entries that are due onto their streams; returns how many."""

    async def claim_once(self, claims: Sequence[tuple[str, str]], ttl_seconds: int) -> list[bool]:
        """Per (key, owner): True if the key was free (now held by owner) or is held by that owner."""

    async def depth(self, stream: str) -> int:
        """Entries on the stream not yet acknowledged (waiting or in flight)."""

    async def oldest(self, stream: str) -> float | None:
        """When (Unix seconds) the stream's oldest entry not yet acknowledged was added; None if empty."""

    async def delayed_count(self) -> int: ...

    async def retire_consumers(self, stream: str, idle_seconds: float, names: Sequence[str] = ()) -> int:
        """Remove the stream's consumers that hold no entries and are in `names` or idle longer
        than `idle_seconds` (a worker that stopped, or died and was taken over); how many."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
