"""Taking envelopes in: every source (the ingest route, the network listener) ends here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from app.core import metrics
from app.envelopes.types import Envelope
from app.fanout.jobs import encode_job
from app.queue.base import ENVELOPES, WorkQueue


async def enqueue_envelopes(
    queue: WorkQueue, envelopes: Sequence[Envelope], clock: Callable[[], int] = time.time_ns
) -> int:
    """Stamp arrival time and queue every envelope for fan-out, all or none; returns how many."""
    received_ns = clock()
    # encode_job(e, r) == FanoutJob(replace(e, received_ns=r)).encode(), without copying each envelope.
    jobs = [encode_job(envelope, received_ns) for envelope in envelopes]
    await queue.add(ENVELOPES, jobs)
    metrics.envelopes_total.labels("ingested").inc(len(jobs))
    return len(jobs)
