"""Fan-out: envelopes queued as they arrive, then one page of a topic's subscribers at a time turned
into delivery jobs.

A topic is read a page at a time in recipient-id order; the next page travels
as a new job at the back of the queue, so a topic with 100,000 subscribers
never sits in memory whole and never holds up the envelopes behind it. When the
first page is full, the rest of the topic is cut into recipient-id ranges, each
its own chain of pages, so every fan-out consumer of every worker can take a
part of one large topic at the same time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import metrics
from app.envelopes.eligibility import Audience, audience, is_own_message, not_pushable_reason, wants
from app.envelopes.types import Envelope
from app.fanout.delivery_job import first_attempts
from app.fanout.fanout_job import FanoutJob, encode_job
from app.queue.base import ENVELOPES, WorkQueue, partition_of
from app.recipients import repository as repo


async def enqueue_envelopes(
    queue: WorkQueue, envelopes: Sequence[Envelope], clock: Callable[[], int] = time.time_ns
) -> int:
    """Stamp arrival time and queue every envelope for fan-out, each partition's all or none (a
    caller told of a failure sends them again: the fan-out's claims drop the repeats); returns how
    many."""
    received_ns = clock()
    # encode_job(e, r) == FanoutJob(replace(e, received_ns=r)).encode(), without copying each envelope.
    # Each in its topic's partition, where its delivery jobs and their retries will be too.
    parts: dict[int, list[bytes]] = {}
    for envelope in envelopes:
        partition = partition_of(envelope.topic, queue.partitions)
        parts.setdefault(partition, []).append(encode_job(envelope, received_ns))
    await queue.add_each(ENVELOPES, parts)
    metrics.envelopes_total.labels("ingested").inc(len(envelopes))
    return len(envelopes)


@dataclass(frozen=True, slots=True)
class Ingested:
    """What an ingest took in: how many envelopes were queued, and of those how many no subscriber
    can receive, by reason (they are queued all the same, and counted as ineligible at fan-out)."""

    accepted: int
    not_pushable: dict[str, int]


async def ingest_envelopes(queue: WorkQueue, envelopes: Sequence[Envelope]) -> Ingested:
    accepted = await enqueue_envelopes(queue, envelopes)
    reasons = Counter(reason for e in envelopes if (reason := not_pushable_reason(e)) is not None)
    return Ingested(accepted, dict(sorted(reasons.items())))


@dataclass(slots=True)
class FanoutPage:
    eligible: bool
    deliveries: dict[int, list[bytes]] = field(default_factory=dict)  # encoded jobs by channel number
    suppressed: Counter[int] = field(default_factory=Counter)  # by channel number
    next_jobs: list[FanoutJob] = field(default_factory=list)


async def fan_out_page(session: AsyncSession, job: FanoutJob, page_size: int, ranges: int = 1) -> FanoutPage:
    envelope = job.envelope
    target = audience(envelope)
    if target is Audience.NOBODY:
        return FanoutPage(eligible=False)
    rows = await repo.subscribers_page(session, envelope.topic, job.after, page_size, job.until)
    page = FanoutPage(eligible=True)
    recipients: dict[int, list[bytes]] = {}
    for row in rows:
        if not wants(envelope, target, row.start_ns, row.include_commits):
            continue
        if is_own_message(envelope, row.hmac_epoch_base, row.hmac_keys):
            page.suppressed[row.channel] += 1
            continue
        recipients.setdefault(row.channel, []).append(row.recipient_id)
    for channel, ids in recipients.items():
        page.deliveries[channel] = first_attempts(
            ids, envelope.topic, envelope.sequence_id, envelope.received_ns
        )
    if len(rows) == page_size:
        last = rows[-1].recipient_id
        parts = ranges if job.first_page else 1
        page.next_jobs = [FanoutJob(envelope, a, u) for a, u in split_after(last, job.until, parts)]
    return page


def split_after(last: bytes, until: bytes, parts: int) -> list[tuple[bytes, bytes]]:
    """(after, until) bounds covering every id above `last` up to `until` (empty: no end), in up to
    `parts` ranges cut at one-byte keys. Recipient ids are random, so equal spans of the first byte
    hold about equal numbers of subscribers; each id falls in exactly one range."""
    low = last[0] + 1 if last else 0  # the one-byte key bytes([v]) is above `last` for every v > last[0]
    if parts <= 1 or until or low > 255:
        return [(last, until)]
    cuts = sorted({low + (256 - low) * n // parts for n in range(1, parts)})
    bounds = [last, *(bytes([v]) for v in cuts)]
    return list(zip(bounds, [*bounds[1:], b""], strict=True))
