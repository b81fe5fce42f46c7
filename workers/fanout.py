"""Fan-out worker: envelopes in, one delivery job per eligible subscriber out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from app.core import metrics
from app.fanout.fanout_job import FanoutJob
from app.fanout.service import FanoutPage, fan_out_page
from app.queue.base import ENVELOPES, Commit, Entry, WorkQueue, delivery_stream
from app.recipients.types import Channel
from app.runtime import Runtime
from workers.outage import Outage

log = logging.getLogger(__name__)
READ_BLOCK_SECONDS = 1.0
# Entries fanned out together. Small, so the ranges of one large topic spread over consumers.
ENTRIES_PER_READ = 4


class FanoutWorker:
    def __init__(self, runtime: Runtime, queue: WorkQueue, consumer: str) -> None:
        self.runtime = runtime
        self.queue = queue
        self.consumer = consumer
        self.page_size = runtime.settings.fanout_page_size
        self.ranges = runtime.settings.fanout_ranges
        self.dedup_ttl = runtime.settings.dedup_ttl_seconds

    async def run(self, stop: asyncio.Event) -> None:
        outage = Outage(log, "fan-out")
        while not stop.is_set():
            try:
                entries = await self.queue.read(
                    ENVELOPES, self.consumer, ENTRIES_PER_READ, READ_BLOCK_SECONDS
                )
                if entries:
                    await self._handle(entries)
                outage.succeeded()
            except Exception as error:
                # What was not acknowledged is reclaimed and fanned out again later.
                await asyncio.sleep(outage.failed(error))

    async def _handle(self, entries: list[Entry]) -> None:
        """Fan out a batch of entries on one database connection, then acknowledge them and queue
        their follow-up work in one step: small topics cost a query each, not a query, a
        connection checkout and a queue round trip each."""
        commit = Commit(ack=[entry.id for entry in entries])
        jobs = await self._claimed(entries)
        pages = []
        async with self.runtime.reads() as session:
            for job in jobs:
                pages.append(await fan_out_page(session, job, self.page_size, self.ranges))
        for page in pages:
            _add_follow_up(commit, page)
        await self.queue.commit(ENVELOPES, commit)
        for job, page in zip(jobs, pages, strict=True):
            _count(job, page)

    async def _claimed(self, entries: list[Entry]) -> list[FanoutJob]:
        """The entries' jobs, less the envelopes already fanned out. A first page claims its envelope
        for its entry (which keeps its id when reclaimed after a crash, and so its claim); the same
        envelope taken in again, in this batch or later, finds the claim held and is dropped. Later
        pages belong to the claim's holder."""
        decoded = [(entry, job) for entry in entries if (job := _decode(entry)) is not None]
        claims = await self.queue.claim_once(
            [(job.dedup_key, entry.id) for entry, job in decoded if job.first_page], self.dedup_ttl
        )
        held = iter(claims)
        return [job for _, job in decoded if not job.first_page or next(held)]


def _decode(entry: Entry) -> FanoutJob | None:
    try:
        return FanoutJob.decode(entry.payload)
    except (ValueError, TypeError, KeyError):
        log.error("dropping an undecodable envelope entry")
        return None


def _add_follow_up(commit: Commit, page: FanoutPage) -> None:
    for channel, payloads in page.deliveries.items():
        commit.add.setdefault(delivery_stream(Channel(channel).label), []).extend(payloads)
    for next_job in page.next_jobs:
        commit.add_to(ENVELOPES, next_job.encode())


def _count(job: FanoutJob, page: FanoutPage) -> None:
    if job.first_page:
        metrics.envelopes_total.labels("fanned_out" if page.eligible else "ineligible").inc()
    for channel, count in page.suppressed.items():
        metrics.deliveries_total.labels(Channel(channel).label, "suppressed").inc(count)


async def run_fanout(runtime: Runtime, queue: WorkQueue, consumer: str, stop: asyncio.Event) -> None:
    loops: Sequence[FanoutWorker] = [
        FanoutWorker(runtime, queue, f"{consumer}-fanout-{n}")
        for n in range(runtime.settings.fanout_concurrency)
    ]
    await asyncio.gather(*(loop.run(stop) for loop in loops))
