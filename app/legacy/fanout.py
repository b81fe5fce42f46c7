"""Legacy fan-out: envelopes queued for the topics' legacy subscriptions, then one page of a topic's
subscribers at a time turned into pushes (docs/legacy.md#from-envelope-to-push).

The same envelopes the new API fans out (from xmtpd and ingest) reach legacy subscriptions too, as the
v3 message an XMTP node would have sent; node-go's come as that message already. Each envelope is
fanned out once, whichever listener or caller brought it (its idempotency key is claimed), and a
topic is read a page at a time in installation-id order, the next page travelling as a new job.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import metrics
from app.core.channels import Channel
from app.envelopes.types import Envelope
from app.legacy import repository as repo
from app.legacy import topics
from app.legacy.commands import MechanismKind
from app.legacy.eligibility import Verdict, period, verdict
from app.legacy.jobs import (
    LEGACY_ENVELOPES,
    LegacyDeliveryJob,
    LegacyEnvelope,
    LegacyFanoutJob,
    legacy_delivery_stream,
)
from app.legacy.messages import envelope_idempotency_key, parse, v3_message
from app.legacy.payloads import channel_for
from app.legacy.service import LegacyRules
from app.queue.base import Commit, WorkQueue, partition_of

ChannelOf = Callable[[int], Channel | None]
# Pages a fan-out job reads before it hands the rest of its topic on as a new job. A job is a queue
# round trip, which waits behind whatever else the worker's loop is doing (delivering the pages
# before): paged a job each, a 100,000-subscription topic took 15 to 18 s to queue, ten a job 2.5 s
# (docs/performance.md, the legacy rows).
PAGES_PER_JOB = 10


def from_network(envelopes: Sequence[Envelope]) -> list[LegacyEnvelope]:
    """The envelopes (from xmtpd or ingest) that have a legacy form, as legacy subscriptions see them."""
    found = []
    for envelope in envelopes:
        topic = topics.to_string(envelope.topic)
        message = v3_message(envelope) if topic is not None else None
        if topic is None or message is None:
            continue
        key = envelope_idempotency_key(envelope, topic, message)
        found.append(LegacyEnvelope(topic, envelope.server_ns, message, key))
    return found


def partition(topic: str, partitions: int) -> int:
    """A legacy topic's partition: its binary topic's, where the new API's work on it goes too."""
    return partition_of(topics.to_bytes(topic) or topic.encode(), partitions)


async def enqueue_legacy(
    queue: WorkQueue, envelopes: Sequence[LegacyEnvelope], clock: Callable[[], int] = time.time_ns
) -> int:
    """Queue every envelope for legacy fan-out, each partition's all or none (a caller told of a
    failure sends them again: the claims drop the repeats); returns how many."""
    received_ns = clock()
    parts: dict[int, list[bytes]] = {}
    for envelope in envelopes:
        job = LegacyFanoutJob(envelope, received_ns)
        parts.setdefault(partition(envelope.topic, queue.partitions), []).append(job.encode())
    if parts:
        await queue.add_each(LEGACY_ENVELOPES, parts)
    return len(envelopes)


@dataclass(slots=True)
class LegacyPage:
    deliveries: dict[str, list[bytes]] = field(default_factory=dict)  # encoded jobs by stream
    # Subscribers not pushed, by (channel, outcome): "suppressed", "ineligible".
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)
    next_job: LegacyFanoutJob | None = None


def channel_chooser(*, apns: bool, fcm: bool, http: bool) -> ChannelOf:
    """The channel a mechanism kind's pushes go by (docs/legacy.md#channels); None: no channel."""
    choice = {int(kind): channel_for(kind.label, apns=apns, fcm=fcm, http=http) for kind in MechanismKind}
    return choice.get


async def fan_out_page(
    session: AsyncSession, rules: LegacyRules, job: LegacyFanoutJob, page_size: int, channel_of: ChannelOf
) -> LegacyPage:
    envelope = job.envelope
    message = parse(envelope.topic, envelope.message)
    this_period = period(envelope.timestamp_ns)
    alive_since = rules.alive_since(rules.clock())
    rows = await repo.subscribers_page(
        session, envelope.topic, job.after, page_size, this_period, alive_since
    )
    page = LegacyPage()
    for row in rows:
        channel = channel_of(row.kind)
        if channel is None:
            continue
        keys = {this_period: row.key} if row.key else {}
        outcome = verdict(message, keys, envelope.timestamp_ns)
        if outcome is not Verdict.PUSH:
            page.skipped[(channel, outcome.value)] += 1
            continue
        delivery = LegacyDeliveryJob(
            row.installation_id,
            envelope.topic,
            envelope.message,
            envelope.timestamp_ns,
            envelope.idempotency_key,
            row.is_silent,
            row.created_ns,
            job.received_ns,
        )
        page.deliveries.setdefault(legacy_delivery_stream(channel), []).append(delivery.encode())
    if len(rows) == page_size:
        page.next_job = LegacyFanoutJob(envelope, job.received_ns, rows[-1].installation_id)
    return page


class LegacyFanout:
    """The legacy source's fan-out jobs, for the one fan-out loop (workers/fanout_worker.py)."""

    stream = LEGACY_ENVELOPES

    def __init__(self, rules: LegacyRules, page_size: int, channel_of: ChannelOf) -> None:
        self.rules, self.page_size, self.channel_of = rules, page_size, channel_of

    def decode(self, payload: bytes) -> LegacyFanoutJob:
        return LegacyFanoutJob.decode(payload)

    def claim(self, job: LegacyFanoutJob) -> str | None:
        return job.claim_key if job.first_page else None

    async def fan_out(self, session: AsyncSession, job: LegacyFanoutJob) -> LegacyPage:
        """Up to PAGES_PER_JOB pages of the topic, as one page whose next job follows the last."""
        page = await fan_out_page(session, self.rules, job, self.page_size, self.channel_of)
        for _ in range(PAGES_PER_JOB - 1):
            if page.next_job is None:
                break
            more = await fan_out_page(session, self.rules, page.next_job, self.page_size, self.channel_of)
            for stream, payloads in more.deliveries.items():
                page.deliveries.setdefault(stream, []).extend(payloads)
            page.skipped.update(more.skipped)
            page.next_job = more.next_job
        return page

    def follow_up(self, commit: Commit, page: LegacyPage) -> None:
        for stream, payloads in page.deliveries.items():
            commit.add.setdefault(stream, []).extend(payloads)
        if page.next_job is not None:
            commit.add_to(LEGACY_ENVELOPES, page.next_job.encode())

    def count(self, job: LegacyFanoutJob, page: LegacyPage) -> None:
        for (channel, outcome), n in page.skipped.items():
            metrics.legacy_deliveries_total.labels(channel, outcome).inc(n)
