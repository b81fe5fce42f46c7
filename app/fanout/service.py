"""Fan-out: one page of a topic's subscribers turned into delivery jobs.

A topic is read a page at a time in recipient-id order; the next page travels
as a new job at the back of the queue, so a topic with 100,000 subscribers
never sits in memory whole and never holds up the envelopes behind it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.delivery.jobs import DeliveryJob
from app.envelopes.eligibility import Audience, audience, is_own_message, wants
from app.fanout.jobs import FanoutJob
from app.recipients import repository as repo


@dataclass(slots=True)
class FanoutPage:
    eligible: bool
    deliveries: dict[int, list[DeliveryJob]] = field(default_factory=dict)  # by channel number
    suppressed: Counter[int] = field(default_factory=Counter)  # by channel number
    next_job: FanoutJob | None = None


async def fan_out_page(session: AsyncSession, job: FanoutJob, page_size: int) -> FanoutPage:
    envelope = job.envelope
    target = audience(envelope)
    if target is Audience.NOBODY:
        return FanoutPage(eligible=False)
    rows = await repo.subscribers_page(session, envelope.topic, job.after, page_size)
    page = FanoutPage(eligible=True)
    for row in rows:
        if not wants(envelope, target, row.start_ns, row.include_commits):
            continue
        if is_own_message(envelope, row.hmac_epoch_base, row.hmac_keys):
            page.suppressed[row.channel] += 1
            continue
        delivery = DeliveryJob.new(
            row.recipient_id, envelope.topic, envelope.sequence_id, envelope.received_ns
        )
        page.deliveries.setdefault(row.channel, []).append(delivery)
    if len(rows) == page_size:
        page.next_job = FanoutJob(envelope, rows[-1].recipient_id)
    return page
