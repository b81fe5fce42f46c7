"""Fan-out worker: envelopes in, one delivery job per eligible subscriber out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import metrics
from app.fanout.fanout_job import FanoutJob
from app.fanout.service import FanoutPage, fan_out_page
from app.queue.base import ENVELOPES, Commit, Entry, Share, Unsent, WorkQueue, delivery_stream
from app.recipients.types import DELIVERY_CHANNELS
from app.runtime import Runtime
from workers.outage import Outage

log = logging.getLogger(__name__)
READ_BLOCK_SECONDS = 1.0
# Entries fanned out together. Small, so the ranges of one large topic spread over consumers.
ENTRIES_PER_READ = 4
# Acknowledgements a fan-out loop keeps to send again while Redis fails over; beyond that, the reclaim.
UNSENT_ACKS = 1_000


class FanoutSource(Protocol):
    """What a source's fan-out jobs are, for the one fan-out loop: the stream they wait on, how one is
    read and claimed, and what a page of its subscribers turns into."""

    stream: str

    def decode(self, payload: bytes) -> Any:
        """A job, or ValueError / TypeError / KeyError."""

    def claim(self, job: Any) -> str | None:
        """The key that makes its envelope fanned out once, for a first page; None for a later page."""

    async def fan_out(self, session: AsyncSession, job: Any) -> Any:
        """One page of the job's subscribers turned into delivery jobs and next pages."""

    def follow_up(self, commit: Commit, page: Any) -> None:
        """Queue what a page made, with its entry's acknowledgement."""

    def count(self, job: Any, page: Any) -> None: ...


class XmtpFanout:
    """The new API's envelopes, to recipients' subscriptions."""

    stream = ENVELOPES

    def __init__(self, runtime: Runtime) -> None:
        self.page_size = runtime.settings.fanout_page_size
        self.ranges = runtime.settings.fanout_ranges

    def decode(self, payload: bytes) -> FanoutJob:
        return FanoutJob.decode(payload)

    def claim(self, job: FanoutJob) -> str | None:
        return job.dedup_key if job.first_page else None

    async def fan_out(self, session: AsyncSession, job: FanoutJob) -> FanoutPage:
        return await fan_out_page(session, job, self.page_size, self.ranges)

    def follow_up(self, commit: Commit, page: FanoutPage) -> None:
        _add_follow_up(commit, page)

    def count(self, job: FanoutJob, page: FanoutPage) -> None:
        _count(job, page)


class FanoutWorker:
    def __init__(
        self,
        runtime: Runtime,
        queue: WorkQueue,
        consumer: str,
        share: Share,
        source: FanoutSource | None = None,
    ) -> None:
        self.runtime = runtime
        self.queue = queue
        self.consumer = consumer
        self.share = share
        self.source = source or XmtpFanout(runtime)
        self.stream = self.source.stream
        self.dedup_ttl = runtime.settings.dedup_ttl_seconds
        self._unsent = Unsent(UNSENT_ACKS)  # commits that failed, sent again before the next batch's

    async def run(self, stop: asyncio.Event) -> None:
        outage = Outage(log, f"{self.stream} fan-out", self.runtime.dependencies)
        while not stop.is_set():
            try:
                entries = await self.queue.read(
                    self.stream, self.consumer, ENTRIES_PER_READ, READ_BLOCK_SECONDS, self.share.partitions
                )
                if entries:
                    await self._handle(entries)
                elif self._unsent:
                    await self._commit([])
                outage.succeeded()
            except Exception as error:
                # What was not acknowledged is reclaimed and fanned out again later.
                await asyncio.sleep(outage.failed(error))

    async def _handle(self, entries: list[Entry]) -> None:
        """Fan out a batch of entries on one database connection, then acknowledge them and queue
        their follow-up work in one step per partition: small topics cost a query each, not a
        query, a connection checkout and a queue round trip each. A topic's pages and delivery
        jobs stay in its envelope's partition, so each partition's step is atomic."""
        commits: dict[int, Commit] = {}
        for entry in entries:
            commits.setdefault(entry.partition, Commit(partition=entry.partition)).ack.append(entry.id)
        jobs = await self._claimed(entries)
        pages = []
        async with self.runtime.reads() as session:
            for _, job in jobs:
                pages.append(await self.source.fan_out(session, job))
        for (partition, _), page in zip(jobs, pages, strict=True):
            self.source.follow_up(commits[partition], page)
        for (_, job), page in zip(jobs, pages, strict=True):
            self.source.count(job, page)  # the work done, as deliveries count their attempts
        await self._commit(list(commits.values()))

    async def _commit(self, commits: list[Commit]) -> None:
        """The commits that failed before, then `commits`; kept for the next time if they fail (one
        that landed after all applies nothing again; were the process to stop first, the entries
        are reclaimed and fanned out again)."""
        batch = self._unsent.take(commits)
        try:
            await self.queue.commit_each(self.stream, batch)
        except Exception:
            self._unsent.keep(batch)
            raise

    async def _claimed(self, entries: list[Entry]) -> list[tuple[int, Any]]:
        """The entries' jobs with their partitions, less the envelopes already fanned out. A first
        page claims its envelope for its entry (which keeps its id when reclaimed after a crash,
        and so its claim); the same envelope taken in again, in this batch or later, finds the claim
        held and is dropped. Later pages belong to the claim's holder.

        An entry is its partition and its id together: partitions added to in one millisecond give
        their entries the same ids. A claim lives in its envelope's partition, so the id alone names
        the owner there; the answers are looked up by both."""
        decoded = [(entry, job) for entry in entries if (job := self._decode(entry)) is not None]
        firsts: dict[int, list[tuple[str, str]]] = {}
        for entry, job in decoded:
            if (key := self.source.claim(job)) is not None:
                firsts.setdefault(entry.partition, []).append((key, entry.id))
        # Each partition's claims in one script; the partitions' at once.
        flags = await asyncio.gather(
            *(self.queue.claim_once(claims, self.dedup_ttl, p) for p, claims in firsts.items())
        )
        held = {
            (partition, owner): flag
            for (partition, claims), answers in zip(firsts.items(), flags, strict=True)
            for (_, owner), flag in zip(claims, answers, strict=True)
        }
        return [
            (entry.partition, job)
            for entry, job in decoded
            if held.get((entry.partition, entry.id), True)  # a later page: its claim's holder's
        ]

    def _decode(self, entry: Entry) -> Any:
        try:
            return self.source.decode(entry.payload)
        except (ValueError, TypeError, KeyError):
            log.error("dropping an undecodable envelope entry")
            return None


def _add_follow_up(commit: Commit, page: FanoutPage) -> None:
    for channel, payloads in page.deliveries.items():
        commit.add.setdefault(delivery_stream(DELIVERY_CHANNELS[channel]), []).extend(payloads)
    for next_job in page.next_jobs:
        commit.add_to(ENVELOPES, next_job.encode())


def _count(job: FanoutJob, page: FanoutPage) -> None:
    if job.first_page:
        metrics.envelopes_total.labels("fanned_out" if page.eligible else "ineligible").inc()
    for channel, count in page.suppressed.items():
        metrics.deliveries_total.labels(DELIVERY_CHANNELS[channel], "suppressed").inc(count)


async def run_fanout(
    runtime: Runtime,
    queue: WorkQueue,
    consumer: str,
    share: Share,
    stop: asyncio.Event,
    source: FanoutSource | None = None,
) -> None:
    """`fanout_concurrency` loops of a source's fan-out (the new API's when None)."""
    name = "fanout" if source is None else f"{source.stream}-fanout"
    loops: Sequence[FanoutWorker] = [
        FanoutWorker(runtime, queue, f"{consumer}-{name}-{n}", share, source)
        for n in range(runtime.settings.fanout_concurrency)
    ]
    await asyncio.gather(*(loop.run(stop) for loop in loops))
