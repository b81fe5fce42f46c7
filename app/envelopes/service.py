"""Taking envelopes in: every source (the ingest route, the network listener) ends here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from app.core import metrics
from app.envelopes.types import Envelope
from app.fanout.jobs import FanoutJob
from app.queue.base import ENVELOPES, WorkQueue


async def enqueue_envelopes(
    queue: WorkQueue, envelopes: Sequence[Envelope], clock: Callable[[], int] = time.time_ns
) -> int:
    """Stamp arrival time and queue every envelope for fan-out, all or none; returns how many."""
    received_ns = clock()
    jobs = [FanoutJob(replace(envelope, received_ns=received_ns)).encode() for envelope in envelopes]
    await queue.add(ENVELOPES, jobs)
    metrics.envelopes_total.labels("ingested").inc(len(jobs))
    return len(jobs)
