"""Recent delivery activity shared by every process: per-minute outcome counts and the listener's lag.

Prometheus counters live in each process; operators' `xmtp-push stats` and the
/status page need the whole deployment's last hour, so workers also add their
counts to per-minute buckets here (in Redis, or in-process for `dev`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.queue.redis_link import RedisLink

BUCKET_SECONDS = 60
KEEP_SECONDS = 2 * 3600
PREFIX = "xmtp-push:activity:"
LISTENER_KEY = "xmtp-push:listener"
# The listeners that report, by the source they read: xmtpd's (the new API's network) and node-go's.
XMTPD, NODE_GO = "xmtpd", "node_go"
LISTENER_KEYS = {XMTPD: LISTENER_KEY, NODE_GO: f"{LISTENER_KEY}:{NODE_GO}"}

Tally = Mapping[tuple[str, str], int]  # (subject, outcome) -> count; see MinuteCount
# Besides outcomes, a tally may count these per channel: attempts made, their milliseconds in all,
# and answers refusing the credentials; the backlog is sampled per queue as "backlog".
ATTEMPTS, ATTEMPT_MS, CREDENTIALS_REFUSED, BACKLOG = (
    "attempts",
    "attempt_ms",
    "credentials_refused",
    "backlog",
)
SIGNALS = frozenset({ATTEMPTS, ATTEMPT_MS, CREDENTIALS_REFUSED, BACKLOG})


@dataclass(frozen=True, slots=True)
class MinuteCount:
    minute: int  # Unix seconds at the start of the minute
    subject: str  # a delivery channel, or for BACKLOG a queue's stream
    outcome: str
    count: int


# "stopped": the listener ended cleanly (a crash leaves its last state, which then goes stale).
LISTENER_STATES = ("connecting", "catching_up", "live", "stopped")


@dataclass(frozen=True, slots=True)
class ListenerState:
    lag_seconds: float
    updated: float  # Unix seconds
    state: str = "live"  # one of LISTENER_STATES
    lag_envelopes: int = 0


class ActivityLog(Protocol):
    async def record(self, tally: Tally, now: float) -> None: ...

    async def record_backlog(self, depths: Mapping[str, int], now: float) -> None:
        """The minute's backlog per queue (the latest sample of the minute)."""

    async def since(self, since: float, now: float) -> list[MinuteCount]: ...

    async def set_listener(self, state: ListenerState, source: str = XMTPD) -> None: ...

    async def listener(self, source: str = XMTPD) -> ListenerState | None: ...


def _minute(moment: float) -> int:
    return int(moment) // BUCKET_SECONDS * BUCKET_SECONDS


def _minutes(since: float, now: float) -> range:
    return range(_minute(since), _minute(now) + 1, BUCKET_SECONDS)


class MemoryActivityLog:
    def __init__(self) -> None:
        self._buckets: dict[int, Counter[tuple[str, str]]] = {}
        self._listeners: dict[str, ListenerState] = {}

    async def record(self, tally: Tally, now: float) -> None:
        self._buckets.setdefault(_minute(now), Counter()).update(tally)
        for minute in [m for m in self._buckets if m < now - KEEP_SECONDS]:
            del self._buckets[minute]

    async def record_backlog(self, depths: Mapping[str, int], now: float) -> None:
        bucket = self._buckets.setdefault(_minute(now), Counter())
        for queue, depth in depths.items():
            bucket[(queue, BACKLOG)] = depth

    async def since(self, since: float, now: float) -> list[MinuteCount]:
        return [
            MinuteCount(minute, subject, outcome, count)
            for minute in _minutes(since, now)
            for (subject, outcome), count in sorted(self._buckets.get(minute, Counter()).items())
        ]

    async def set_listener(self, state: ListenerState, source: str = XMTPD) -> None:
        self._listeners[source] = state

    async def listener(self, source: str = XMTPD) -> ListenerState | None:
        return self._listeners.get(source)


class RedisActivityLog:
    """In Redis (a single one or a cluster), through the process's link: a minute's counts are one
    hash, so every command of a pipeline below touches one key."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def record(self, tally: Tally, now: float) -> None:
        if not tally:
            return
        key = f"{PREFIX}{_minute(now)}"

        async def call(client: Any) -> None:
            pipe = client.pipeline(transaction=False)
            for (subject, outcome), count in tally.items():
                pipe.hincrby(key, f"{subject}|{outcome}", count)
            pipe.expire(key, KEEP_SECONDS)
            await pipe.execute()

        await self._link.run(call, retry=False)

    async def record_backlog(self, depths: Mapping[str, int], now: float) -> None:
        key = f"{PREFIX}{_minute(now)}"

        async def call(client: Any) -> None:
            pipe = client.pipeline(transaction=False)
            pipe.hset(key, mapping={f"{queue}|{BACKLOG}": depth for queue, depth in depths.items()})
            pipe.expire(key, KEEP_SECONDS)
            await pipe.execute()

        await self._link.run(call, retry=False)

    async def since(self, since: float, now: float) -> list[MinuteCount]:
        minutes = list(_minutes(since, now))

        async def call(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for minute in minutes:
                pipe.hgetall(f"{PREFIX}{minute}")
            return list(await pipe.execute())

        buckets = await self._link.run(call, retry=False)
        counts = []
        for minute, bucket in zip(minutes, buckets, strict=True):
            for field, value in sorted(bucket.items()):
                subject, _, outcome = _text(field).partition("|")
                counts.append(MinuteCount(minute, subject, outcome, int(value)))
        return counts

    async def set_listener(self, state: ListenerState, source: str = XMTPD) -> None:
        key = LISTENER_KEYS[source]
        mapping = {
            "lag": state.lag_seconds,
            "updated": state.updated,
            "state": LISTENER_STATES.index(state.state),
            "lag_envelopes": state.lag_envelopes,
        }
        await self._link.run(lambda client: client.hset(key, mapping=mapping), retry=False)

    async def listener(self, source: str = XMTPD) -> ListenerState | None:
        key = LISTENER_KEYS[source]
        raw = await self._link.run(lambda client: client.hgetall(key), retry=False)
        if not raw:
            return None
        values = {_text(k): float(v) for k, v in raw.items()}
        state = LISTENER_STATES[int(values.get("state", len(LISTENER_STATES) - 1))]
        return ListenerState(values["lag"], values["updated"], state, int(values.get("lag_envelopes", 0)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
