"""What `xmtp-push stats` and /status show: the deployment at a glance."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from app.ops import repository
from app.queue.activity import CREDENTIALS_REFUSED, SIGNALS, ListenerState, MinuteCount
from app.queue.base import ENVELOPES, delivery_stream
from app.recipients.types import WireChannel
from app.runtime import Runtime

HOUR = 3600
CHANNELS = tuple(c for c in WireChannel if c is not WireChannel.UNSPECIFIED)
CHANNEL_LABELS = tuple(c.channel for c in CHANNELS)
# Final outcomes that are not a delivery (suppressed is neither: nothing was sent).
FAILURES = ("failed", "rejected", "mismatch", "dead")
# A listener that has not reported for this long is shown as not reporting.
LISTENER_STALE_SECONDS = 120.0


@dataclass(slots=True)
class Stats:
    recipients: dict[str, int]  # by channel label
    subscriptions: int
    queue_depths: dict[str, int] | None  # None without a queue
    retries_waiting: int | None
    outcomes: dict[str, dict[str, int]]  # channel -> outcome -> count, last hour
    minutes: list[MinuteCount] = field(default_factory=list)  # per-minute outcomes, last hour
    listener: ListenerState | None = None
    generated: float = 0.0
    # Per minute, last hour: attempts and their milliseconds, credential refusals (per channel), and
    # the backlog (per queue); see app/queue/activity.py.
    series: list[MinuteCount] = field(default_factory=list)
    credentials_refused: dict[str, int] = field(default_factory=dict)  # by channel, last hour


async def collect_stats(runtime: Runtime) -> Stats:
    async with runtime.sessions() as session:
        by_channel = await repository.recipients_by_channel(session)
        subscriptions = await repository.subscription_count(session)
    now = time.time()
    recorded = await runtime.activity.since(now - HOUR, now) if runtime.activity else []
    minutes = [m for m in recorded if m.outcome not in SIGNALS]
    series = [m for m in recorded if m.outcome in SIGNALS]
    listener = await runtime.activity.listener() if runtime.activity else None
    depths, retries = await _queue_depths(runtime)
    return Stats(
        recipients={c.channel: by_channel.get(int(c), 0) for c in CHANNELS},
        subscriptions=subscriptions,
        queue_depths=depths,
        retries_waiting=retries,
        outcomes=_totals(minutes),
        minutes=minutes,
        listener=listener,
        generated=now,
        series=series,
        credentials_refused=_refusals(series),
    )


async def _queue_depths(runtime: Runtime) -> tuple[dict[str, int] | None, int | None]:
    queue = runtime.queue
    if queue is None:
        return None, None
    streams = [ENVELOPES, *(delivery_stream(c.channel) for c in CHANNELS)]
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
    age = now - listener.updated
    if listener.state == "stopped":
        return f"stopped {age:.0f} s ago (a clean stop)", "off"
    if age > LISTENER_STALE_SECONDS:
        return f"not reporting for {age:.0f} s (last seen {listener.state.replace('_', ' ')})", "bad"
    if listener.state == "live":
        lag = f"{listener.lag_seconds:.1f} s, {listener.lag_envelopes} envelopes past the stored cursor"
        return f"live, lag {lag}", "ok"
    return f"{listener.state.replace('_', ' ')} (lag {listener.lag_seconds:.1f} s)", "warn"
