"""Legacy fan-out: envelopes queued for the topics' legacy subscriptions, then one page of a topic's
subscribers at a time turned into pushes (docs/legacy.md#from-envelope-to-push).

The same envelopes the new API fans out (from xmtpd and ingest) reach legacy subscriptions too, as the
v3 message an XMTP node would have sent; node-go's come as that message already. Each envelope is
fanned out once, whichever listener or caller brought it (its idempotency key is claimed), and a
topic is read a page at a time in installation-id order, the next pages travelling as a new job.
When the first page is full, the rest of the topic is cut into installation-id ranges whose bounds
the database reads from the topic's subscriptions (the ids are the apps' strings: no fixed cuts fit
them), each its own chain of jobs, so every fan-out consumer can take a part of one large topic.
"""

from __future__ import annotations

import logging
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
    LegacyEnvelope,
    LegacyFanoutJob,
    encode_delivery,
    legacy_delivery_stream,
    shared_fields,
)
from app.legacy.messages import envelope_idempotency_key, parse, v3_message
from app.legacy.payloads import DEFAULT_PAYLOADS, PayloadSettings, channel_for, refused_for_size
from app.legacy.service import LegacyRules
from app.queue.base import Commit, WorkQueue, partition_of

log = logging.getLogger(__name__)
ChannelOf = Callable[[int], Channel | None]
# Pages a fan-out job reads before it hands the rest of its topic on as a new job. A job is a queue
# round trip, which waits behind whatever else the worker's loop is doing (delivering the pages
# before): paged a job each, a 100,000-subscription topic took 15 to 18 s to queue, ten a job 2.5 s
# (docs/performance.md, the legacy rows).
PAGES_PER_JOB = 10
REJECTED = "rejected"
STREAMS = {channel: legacy_delivery_stream(channel) for channel in Channel}


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
    # The rest of the topic: one job going on where the page ended, or its ranges after a first page.
    next_jobs: list[LegacyFanoutJob] = field(default_factory=list)


def channel_chooser(*, apns: bool, fcm: bool, http: bool) -> ChannelOf:
    """The channel a mechanism kind's pushes go by (docs/legacy.md#channels); None: no channel."""
    choice = {int(kind): channel_for(kind.label, apns=apns, fcm=fcm, http=http) for kind in MechanismKind}
    return choice.get


async def fan_out_page(
    session: AsyncSession,
    rules: LegacyRules,
    job: LegacyFanoutJob,
    page_size: int,
    channel_of: ChannelOf,
    ranges: int = 1,
    payloads: PayloadSettings = DEFAULT_PAYLOADS,
) -> LegacyPage:
    envelope = job.envelope
    this_period = period(envelope.timestamp_ns)
    alive_since = rules.alive_since(rules.clock())
    rows = await repo.subscribers_page(
        session, envelope.topic, job.after, page_size, this_period, alive_since, job.until
    )
    page = LegacyPage()
    sorter = _Sorter(envelope, channel_of, payloads)
    for row in rows:
        sorter.sort(row, page, job.received_ns)
    if len(rows) == page_size:
        last = rows[-1].installation_id
        bounds = await split_after(session, job, last, ranges if job.first_page else 1)
        page.next_jobs = [LegacyFanoutJob(envelope, job.received_ns, a, u) for a, u in bounds]
    return page


class _Sorter:
    """Each subscriber of one envelope's page to its channel's stream, or counted as skipped. What all
    of them share is worked out once: the parsed message, the verdict for a subscription without a key
    for the envelope's period (most of them), the job's shared part, each form's size check."""

    def __init__(self, envelope: LegacyEnvelope, channel_of: ChannelOf, payloads: PayloadSettings) -> None:
        self.envelope, self.channel_of, self.payloads = envelope, channel_of, payloads
        self.message = parse(envelope.topic, envelope.message)
        self.keyless = verdict(self.message, {}, envelope.timestamp_ns)
        self.period = period(envelope.timestamp_ns)
        e = envelope
        self.shared = shared_fields(e.topic, e.message, e.timestamp_ns, e.idempotency_key)
        # A message too large for a channel is refused for every subscriber on it: decided once per
        # (channel, silence) and counted `rejected` here, rather than queued once per subscriber.
        self.too_large: dict[tuple[Channel, bool], bool] = {}

    def sort(self, row: repo.SubscriberRow, page: LegacyPage, received_ns: int) -> None:
        channel = self.channel_of(row.kind)
        if channel is None:
            return
        outcome = self.keyless
        if row.key:
            outcome = verdict(self.message, {self.period: row.key}, self.envelope.timestamp_ns)
        if outcome is not Verdict.PUSH:
            page.skipped[(channel, outcome.value)] += 1
            return
        if self._too_large(channel, row.is_silent):
            page.skipped[(channel, REJECTED)] += 1
            return
        encoded = encode_delivery(
            row.installation_id, self.shared, row.is_silent, row.created_ns, received_ns
        )
        page.deliveries.setdefault(STREAMS[channel], []).append(encoded)

    def _too_large(self, channel: Channel, is_silent: bool) -> bool:
        form = (channel, is_silent)
        if form not in self.too_large:
            e = self.envelope
            self.too_large[form] = refused_for_size(channel, e.topic, e.message, is_silent, self.payloads)
        return self.too_large[form]


async def split_after(
    session: AsyncSession, job: LegacyFanoutJob, last: str, parts: int
) -> list[tuple[str, str]]:
    """(after, until) bounds covering every id above `last` up to the job's `until`, in up to `parts`
    ranges of about as many subscriptions. The last range runs to the end, so an id subscribed
    after the split falls in exactly one range too."""
    if parts <= 1 or job.until:
        return [(last, job.until)]
    ends = await repo.range_ends(session, job.envelope.topic, last, parts)
    bounds = [last, *ends[:-1]]
    return list(zip(bounds, [*ends[:-1], ""], strict=True))


class LegacyFanout:
    """The legacy source's fan-out jobs, for the one fan-out loop (workers/fanout_worker.py)."""

    stream = LEGACY_ENVELOPES

    def __init__(
        self,
        rules: LegacyRules,
        page_size: int,
        channel_of: ChannelOf,
        ranges: int = 1,
        payloads: PayloadSettings = DEFAULT_PAYLOADS,
    ) -> None:
        self.rules, self.page_size, self.channel_of, self.ranges = rules, page_size, channel_of, ranges
        self.payloads = payloads

    def decode(self, payload: bytes) -> LegacyFanoutJob:
        return LegacyFanoutJob.decode(payload)

    def claim(self, job: LegacyFanoutJob) -> str | None:
        return job.claim_key if job.first_page else None

    async def fan_out(self, session: AsyncSession, job: LegacyFanoutJob) -> LegacyPage:
        """Up to PAGES_PER_JOB pages of the job's part of the topic, as one page whose next jobs
        follow the last; a first page that is full hands the rest on at once, as ranges."""
        page = await self._page(session, job)
        for _ in range(PAGES_PER_JOB - 1):
            if len(page.next_jobs) != 1:  # the end, or a first page's ranges for other consumers
                break
            more = await self._page(session, page.next_jobs[0])
            for stream, payloads in more.deliveries.items():
                page.deliveries.setdefault(stream, []).extend(payloads)
            page.skipped.update(more.skipped)
            page.next_jobs = more.next_jobs
        return page

    async def _page(self, session: AsyncSession, job: LegacyFanoutJob) -> LegacyPage:
        return await fan_out_page(
            session, self.rules, job, self.page_size, self.channel_of, self.ranges, self.payloads
        )

    def follow_up(self, commit: Commit, page: LegacyPage) -> None:
        for stream, payloads in page.deliveries.items():
            commit.add.setdefault(stream, []).extend(payloads)
        for next_job in page.next_jobs:
            commit.add_to(LEGACY_ENVELOPES, next_job.encode())

    def count(self, job: LegacyFanoutJob, page: LegacyPage) -> None:
        for (channel, outcome), n in page.skipped.items():
            metrics.legacy_deliveries_total.labels(channel, outcome).inc(n)
            if outcome == REJECTED:
                log.warning("legacy message too large for %s: %d installations not pushed", channel, n)
