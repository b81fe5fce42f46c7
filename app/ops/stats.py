"""What `xmtp-push stats` and /status show: the deployment at a glance."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from app.ops import repository
from app.ops.failures import tell_or_log
from app.queue.activity import (
    CREDENTIALS_REFUSED,
    NODE_GO,
    SIGNALS,
    ListenerState,
    MinuteCount,
    RedisActivityLog,
)
from app.queue.base import ENVELOPES, delivery_stream
from app.recipients.types import XMTP_CHANNELS
from app.runtime import Runtime

log = logging.getLogger(__name__)
T = TypeVar("T")
HOUR = 3600
UNKNOWN_WHILE_DOWN = "the status shows what it holds as unknown until it answers"
CHANNEL_LABELS = tuple(c.channel for c in XMTP_CHANNELS)
# Final outcomes that are not a delivery (suppressed is neither: nothing was sent).
FAILURES = ("failed", "rejected", "mismatch", "dead")
# A listener that has not reported for this long is shown as not reporting.
LISTENER_STALE_SECONDS = 120.0


@dataclass(slots=True)
class Stats:
    recipients: dict[str, int] | None  # by channel label; None while the database does not answer
    subscriptions: int | None
    queue_depths: dict[str, int] | None  # None without a queue, or while it cannot be read
    retries_waiting: int | None
    outcomes: dict[str, dict[str, int]]  # channel -> outcome -> count, last hour
    minutes: list[MinuteCount] = field(default_factory=list)  # per-minute outcomes, last hour
    listener: ListenerState | None = None  # xmtpd's
    node_go_listener: ListenerState | None = None
    generated: float = 0.0
    # Per minute, last hour: attempts and their milliseconds, credential refusals (per channel), and
    # the backlog (per queue); see app/queue/activity.py.
    series: list[MinuteCount] = field(default_factory=list)
    credentials_refused: dict[str, int] = field(default_factory=dict)  # by channel, last hour
    # database, redis: ok | unavailable | not configured (what is read from one that is unavailable
    # is unknown, not zero)
    dependencies: dict[str, str] = field(default_factory=dict)


async def collect_stats(runtime: Runtime, *, unknown_while_down: bool = False) -> Stats:
    """What the deployment shows now. A service that does not answer raises its failure (`stats`
    exits with its code), or with `unknown_while_down` (the status page) leaves its part unknown."""
    now = time.time()

    async def read(part: Awaitable[T]) -> T | None:
        return await (_unless_down(runtime, part) if unknown_while_down else part)

    counts = await read(_database_counts(runtime))
    activity = runtime.activity
    recorded = await read(activity.since(now - HOUR, now)) if activity else []
    listener = await read(activity.listener()) if activity else None
    node_go_listener = await read(activity.listener(NODE_GO)) if activity else None
    queued = await read(_queue_depths(runtime)) if runtime.queue is not None else None
    minutes = [m for m in recorded or [] if m.outcome not in SIGNALS]
    series = [m for m in recorded or [] if m.outcome in SIGNALS]
    by_channel, subscriptions = counts or (None, None)
    depths, retries = queued or (None, None)
    return Stats(
        recipients=None
        if by_channel is None
        else {c.channel: by_channel.get(int(c), 0) for c in XMTP_CHANNELS},
        subscriptions=subscriptions,
        queue_depths=depths,
        retries_waiting=retries,
        outcomes=_totals(minutes),
        minutes=minutes,
        listener=listener,
        node_go_listener=node_go_listener,
        generated=now,
        series=series,
        credentials_refused=_refusals(series),
        dependencies=_dependencies(runtime, database=counts is not None, redis=recorded is not None),
    )


async def _unless_down(runtime: Runtime, read: Awaitable[T]) -> T | None:
    """What `read` gives, or None when its service does not answer (said once per outage)."""
    try:
        return await read
    except Exception as error:
        tell_or_log(error, runtime.dependencies, UNKNOWN_WHILE_DOWN, log, "a part of the status failed")
        return None


def _dependencies(runtime: Runtime, *, database: bool, redis: bool) -> dict[str, str]:
    uses_redis = isinstance(runtime.activity, RedisActivityLog)
    return {
        "database": "ok" if database else "unavailable",
        "redis": ("ok" if redis else "unavailable") if uses_redis else "not configured",
    }


async def _database_counts(runtime: Runtime) -> tuple[dict[int, int], int]:
    async with runtime.sessions() as session:
        return await repository.recipients_by_channel(session), await repository.subscription_count(session)


async def _queue_depths(runtime: Runtime) -> tuple[dict[str, int], int]:
    queue = runtime.queue
    assert queue is not None
    streams = [ENVELOPES, *(delivery_stream(c.channel) for c in XMTP_CHANNELS)]
    return {stream: await queue.depth(stream) for stream in streams}, await queue.delayed_count()


def _refusals(series: list[MinuteCount]) -> dict[str, int]:
    refused: Counter[str] = Counter()
    for item in series:
        if item.outcome == CREDENTIALS_REFUSED:
            refused[item.subject] += item.count
    return dict(sorted(refused.items()))


def _totals(minutes: list[MinuteCount]) -> dict[str, dict[str, int]]:
    totals: dict[str, Counter[str]] = {}
    for item in minutes:
        totals.setdefault(item.subject, Counter())[item.outcome] += item.count
    return {channel: dict(counts) for channel, counts in sorted(totals.items())}


def listener_summary(listener: ListenerState | None, now: float) -> tuple[str, str]:
    """The listener in words, and how it fares: `ok`, `warn`, `bad`, or `off` (not running, by choice)."""
    if listener is None:
        return "not configured: no listener has reported (run `xmtp-push listen`)", "off"
    if (gone := _not_running(listener, now)) is not None:
        return gone
    if listener.state == "live":
        lag = f"{listener.lag_seconds:.1f} s, {listener.lag_envelopes} envelopes past the stored cursor"
        return f"live, lag {lag}", "ok"
    return f"{listener.state.replace('_', ' ')} (lag {listener.lag_seconds:.1f} s)", "warn"


def node_go_summary(listener: ListenerState | None, now: float) -> tuple[str, str]:
    """The node-go listener (the legacy API's) in words, and how it fares, as `listener_summary`."""
    if listener is None:
        return (
            "not configured: none has reported (the legacy API's `listen` with XMTP_PUSH_NODE_GO_ADDRESS)",
            "off",
        )
    if (gone := _not_running(listener, now)) is not None:
        return gone
    if listener.state == "live":
        return f"live, the last envelope read {listener.lag_seconds:.1f} s after the node stamped it", "ok"
    return "connecting: what the node publishes meanwhile is read by another listener or not at all", "warn"


def _not_running(listener: ListenerState, now: float) -> tuple[str, str] | None:
    age = now - listener.updated
    if listener.state == "stopped":
        return f"stopped {age:.0f} s ago (a clean stop)", "off"
    if age > LISTENER_STALE_SECONDS:
        return f"not reporting for {age:.0f} s (last seen {listener.state.replace('_', ' ')})", "bad"
    return None
