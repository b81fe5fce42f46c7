"""What arrived at the receiver, against what was expected: loss, duplicates, signatures, latency."""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from bench._support import percentile

# standardwebhooks refuses a timestamp more than 5 minutes from its clock.
TOLERANCE_SECONDS = 300

# Widths tried for the report's time series, smallest first: the first giving at most SERIES_POINTS windows.
SERIES_WIDTHS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
SERIES_POINTS = 60


@dataclass
class Receipts:
    expected: int
    unique: int
    duplicates: int
    missing: int
    unexpected: int
    bad_bodies: int
    latencies_ms: list[float]
    first_arrival: int
    last_arrival: int
    arrivals: list[int]  # sorted arrival ns of first receipts
    latency_by_arrival: list[tuple[int, float]]
    samples_checked: int
    samples_failed: int


def first_receipts(
    records: Sequence[Sequence[Any]], expected: set[tuple[bytes, int]]
) -> tuple[dict[tuple[bytes, int], int], int, int]:
    """(first arrival of each expected delivery, duplicates, unexpected) from the receiver's records."""
    seen: dict[tuple[bytes, int], int] = {}
    duplicates = unexpected = 0
    for recipient_hex, _topic, sequence_id, arrival in records:
        key = (bytes.fromhex(recipient_hex), sequence_id)
        if key in seen:
            duplicates += 1
            seen[key] = min(seen[key], arrival)
            continue
        if key not in expected:
            unexpected += 1
            continue
        seen[key] = arrival
    return seen, duplicates, unexpected


def verify_samples(samples: Sequence[Sequence[Any]], keys: dict[bytes, bytes]) -> tuple[int, int]:
    """(checked, failed) signatures of the sampled hooks, each verified by standardwebhooks as at
    its arrival: the library checks the timestamp against the clock, and a long run's early samples
    are older than its 5-minute tolerance by the time they are checked."""
    checked = failed = 0
    for headers, body, arrived in samples:
        try:
            recipient = bytes.fromhex(json.loads(body)["recipient_id"])
            verify_as_at(Webhook(keys[recipient]), body, headers, arrived)
        except (WebhookVerificationError, KeyError, ValueError):
            failed += 1
        checked += 1
    return checked, failed


def verify_as_at(webhook: Webhook, body: str, headers: dict[str, str], arrived: float) -> None:
    """`webhook.verify(body, headers)` as it would have answered at `arrived`. A sample still inside
    the library's tolerance is verified by it as is; an older one is checked the same way by hand:
    its timestamp against the arrival time, its signature against the library's `sign`."""
    if time.time() - arrived < TOLERANCE_SECONDS - 60:
        webhook.verify(body, headers)
        return
    stamp = int(headers["webhook-timestamp"])
    if abs(arrived - stamp) > TOLERANCE_SECONDS:
        raise WebhookVerificationError("timestamp outside the tolerance when it arrived")
    expected = webhook.sign(headers["webhook-id"], datetime.fromtimestamp(stamp, tz=UTC), body)
    if expected not in headers["webhook-signature"].split(" "):
        raise WebhookVerificationError("No matching signature found")


def analyse(
    dump: dict[str, Any], expected: set[tuple[bytes, int]], sent_ns: dict[int, int], keys: dict[bytes, bytes]
) -> Receipts:
    seen, duplicates, unexpected = first_receipts(dump["records"], expected)
    latency_by_arrival = sorted(
        (arrival, (arrival - sent_ns[seq]) / 1e6) for (_, seq), arrival in seen.items() if seq in sent_ns
    )
    checked, failed = verify_samples(dump["samples"], keys)
    arrivals = sorted(seen.values())
    return Receipts(
        expected=len(expected),
        unique=len(seen),
        duplicates=duplicates,
        missing=len(expected) - len(seen),
        unexpected=unexpected,
        bad_bodies=int(dump.get("bad", 0)),
        latencies_ms=sorted(latency for _, latency in latency_by_arrival),
        first_arrival=arrivals[0] if arrivals else 0,
        last_arrival=arrivals[-1] if arrivals else 0,
        arrivals=arrivals,
        latency_by_arrival=latency_by_arrival,
        samples_checked=checked,
        samples_failed=failed,
    )


def steady_rate(arrivals: Sequence[int], low: float = 0.1, high: float = 0.9) -> float:
    """Arrivals per second between the low and high quantiles of arrival order (no ramp-up or tail)."""
    if len(arrivals) < 20:
        return math.nan
    i, j = int(len(arrivals) * low), int(len(arrivals) * high) - 1
    span = (arrivals[j] - arrivals[i]) / 1e9
    return (j - i) / span if span > 0 else math.nan


def ms(values: Sequence[float], pct: float) -> float:
    return percentile(values, pct) if values else math.nan


def describe_receipts(r: Receipts) -> str:
    return (
        f"receipts: {r.unique}/{r.expected} unique, {r.missing} missing, {r.duplicates} duplicates, "
        f"{r.unexpected} unexpected, {r.bad_bodies} unparsable; signatures verified on "
        f"{r.samples_checked} samples, {r.samples_failed} failed"
    )


def describe_latency(values: Sequence[float]) -> str:
    if not values:
        return "latency: no receipts"
    return (
        f"ingest->receipt latency: p50 {ms(values, 50):.1f} ms, p90 {ms(values, 90):.1f} ms, "
        f"p99 {ms(values, 99):.1f} ms, max {values[-1]:.1f} ms (n={len(values)})"
    )


def by_window(
    latency_by_arrival: Sequence[tuple[int, float]], origin: int, window: float
) -> dict[int, list[float]]:
    """Latencies (ms) grouped by the `window`-second interval of arrival they fall in, counted from `origin` ns."""
    buckets: dict[int, list[float]] = collections.defaultdict(list)
    for arrival, latency in latency_by_arrival:
        buckets[int((arrival - origin) / 1e9 // window)].append(latency)
    return buckets


def series_width(span_seconds: float) -> float:
    for width in SERIES_WIDTHS:
        if span_seconds / width <= SERIES_POINTS:
            return width
    return SERIES_WIDTHS[-1]


def time_series(
    latency_by_arrival: Sequence[tuple[int, float]], origin: int
) -> tuple[float, list[dict[str, float]]]:
    """(window width s, one row per window since `origin` ns, empty windows included): deliveries/s and
    p50/p99/max ingest-to-receipt latency of the deliveries first received in that window."""
    if not latency_by_arrival:
        return math.nan, []
    width = series_width((latency_by_arrival[-1][0] - origin) / 1e9)
    buckets = by_window(latency_by_arrival, origin, width)
    rows = []
    for index in range(max(buckets) + 1):
        values = sorted(buckets.get(index, ()))
        rows.append(
            {
                "t_s": round(index * width, 6),
                "n": len(values),
                "deliveries_per_s": len(values) / width,
                "p50_ms": ms(values, 50),
                "p99_ms": ms(values, 99),
                "max_ms": values[-1] if values else math.nan,
            }
        )
    return width, rows
