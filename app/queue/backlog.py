"""The backlog as gauges: entries per stream, retries waiting, the oldest entry's age.

Read from the queue itself, so whichever process can see Redis tells the whole deployment's backlog
(one scrape target suffices; every target tells the same, so dashboards take `max`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from app.core import metrics
from app.queue.base import WorkQueue

RETRIES = "retries"


async def sample_backlog(queue: WorkQueue, streams: Sequence[str]) -> dict[str, int]:
    """Set the backlog gauges; returns the depths (with retries waiting under "retries"). When the
    queue cannot be read, the gauges are left out until it can (an unknown depth must not read as
    an empty queue, nor as the last one seen), and the error is raised."""
    try:
        return await _sample(queue, streams)
    except Exception:
        metrics.queue_depth.clear()
        metrics.queue_oldest_seconds.clear()
        metrics.retries_waiting.set(float("nan"))  # no labels to leave out: NaN, Prometheus' unknown
        raise


async def _sample(queue: WorkQueue, streams: Sequence[str]) -> dict[str, int]:
    now = time.time()
    depths: dict[str, int] = {}
    for stream in streams:
        depths[stream] = await queue.depth(stream)
        oldest = await queue.oldest(stream)
        metrics.queue_depth.labels(stream).set(depths[stream])
        metrics.queue_oldest_seconds.labels(stream).set(0.0 if oldest is None else max(0.0, now - oldest))
    depths[RETRIES] = await queue.delayed_count()
    metrics.queue_depth.labels(RETRIES).set(depths[RETRIES])
    metrics.retries_waiting.set(depths[RETRIES])
    return depths
