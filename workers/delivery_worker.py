"""Delivery worker for one XMTP channel: reads its stream, renders each hint for the channel,
sends with bounded concurrency through the channel's provider, records outcomes.

Reading never waits for a batch to finish: each attempt frees its slot when it
ends, and finished attempts are acknowledged together every 20 ms.
One slow receiver holds only its own slots; other channels have their own
workers and streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.metrics import Counter as Counter_

from app.core import metrics
from app.core.channels import Channel
from app.delivery.provider import Provider
from app.delivery.registry import CHANNELS, log_outcome
from app.delivery.retry import Retry
from app.delivery.types import Outcome, OutcomeKind, Push
from app.fanout.delivery_job import DeliveryJob
from app.fanout.hints import RENDERERS
from app.queue.activity import ATTEMPT_MS, ATTEMPTS, CREDENTIALS_REFUSED
from app.queue.base import Commit, Delayed, Entry, Share, Unsent, WorkQueue, delivery_stream
from app.recipients.types import Target
from app.runtime import Runtime
from workers.outage import Outage

log = logging.getLogger(__name__)
READ_BLOCK_SECONDS = 1.0
# Each flush is one queue round trip whatever it carries, so fewer carry more. A crash repeats at
# most this much finished work, the only case where a hint may go twice.
FLUSH_SECONDS = 0.02
# Acknowledgements a worker keeps to send again while Redis fails over; beyond that, the reclaim.
UNSENT_ACKS = 10_000
FLUSH_SIZE = 256
ACTIVITY_SECONDS = 1.0
REFILL_FRACTION = 4


class TargetStore(Protocol):
    """Where recipients' hints go (the recipients package keeps them)."""

    async def targets(self, recipient_ids: Sequence[bytes]) -> Mapping[bytes, Target]:
        """The current target of each recipient that still exists."""

    async def forget_if_unchanged(self, recipient_id: bytes, target: Target) -> bool:
        """Forget a recipient whose target is dead, unless it changed since; True if forgotten."""


class DeliverySource(Protocol):
    """What a source's delivery jobs are, for the one delivery loop: how a job is read, whom it is
    for, where that one's pushes go now, and how it is rendered for its channel. The loop itself
    (slots, retries, acknowledgements) knows nothing of the source."""

    def stream(self, channel: Channel) -> str:
        """The stream of the source's jobs on a channel."""

    def decode(self, payload: bytes) -> Any:
        """A job, or ValueError / TypeError / KeyError."""

    def key(self, job: Any) -> Hashable:
        """Whom the job is for (a recipient, an installation)."""

    async def targets(self, keys: Sequence[Any]) -> Mapping[Any, Any]:
        """The current target of each that may still be pushed to."""

    def channel_of(self, target: Any) -> Channel | None:
        """The channel a target's pushes go by now; None: no configured channel delivers it."""

    def render(self, channel: Channel, job: Any, target: Any) -> Push:
        """The job's push on its channel."""

    def rank(self, job: Any) -> int:
        """Among retries waiting under one key, the highest rank waits (a newer hint's)."""

    async def forget_if_unchanged(self, key: Any, target: Any) -> bool:
        """Forget a dead target, unless it changed since; True if forgotten."""

    def outcome_counter(self, channel: Channel, kind: OutcomeKind) -> Counter_:
        """The counter of the source's final outcomes on a channel."""

    def count_dead(self) -> None:
        """A target was forgotten as dead."""


class XmtpDeliveries:
    """The new API's hints: jobs on `deliveries.<channel>`, for recipients."""

    def __init__(self, store: TargetStore) -> None:
        self.store = store

    def stream(self, channel: Channel) -> str:
        return delivery_stream(channel)

    def decode(self, payload: bytes) -> DeliveryJob:
        return DeliveryJob.decode(payload)

    def key(self, job: DeliveryJob) -> bytes:
        return job.recipient_id

    async def targets(self, keys: Sequence[bytes]) -> Mapping[bytes, Target]:
        return await self.store.targets(keys)

    def channel_of(self, target: Target) -> Channel:
        return target.channel

    def render(self, channel: Channel, job: DeliveryJob, target: Target) -> Push:
        return RENDERERS[channel](job.hint, target)

    def rank(self, job: DeliveryJob) -> int:
        return job.sequence_id

    async def forget_if_unchanged(self, key: bytes, target: Target) -> bool:
        return await self.store.forget_if_unchanged(key, target)

    def outcome_counter(self, channel: Channel, kind: OutcomeKind) -> Counter_:
        return metrics.deliveries_total.labels(channel, kind.value)

    def count_dead(self) -> None:
        metrics.recipients_total.labels("dead").inc()


@dataclass(slots=True)
class _Work:
    entry: Entry
    job: Any
    target: Any


class DeliveryWorker:
    def __init__(
        self,
        runtime: Runtime,
        queue: WorkQueue,
        provider: Provider,
        source: DeliverySource,
        consumer: str,
        share: Share,
    ) -> None:
        self.runtime = runtime
        self.share = share
        self.queue = queue
        self.provider = provider
        self.source = source
        self.consumer = consumer
        self.channel = provider.channel
        self.stream = source.stream(self.channel)
        settings = runtime.settings
        self.capacity = settings.delivery_concurrency
        # Read once this many slots are free, not on every freed slot: at full load each read
        # (a queue round trip, a recipient query, a claim round trip) then serves a batch.
        self.refill = max(1, self.capacity // REFILL_FRACTION)
        self.retry = CHANNELS[self.channel].retry.configured(settings)
        # Attempts run on `capacity` long-lived slot coroutines fed from `_ready`, not one task each:
        # creating, scheduling and finishing a task per attempt was a measurable share of its cost.
        self._ready: deque[_Work] = deque()
        self._idle: deque[asyncio.Future[_Work | None]] = deque()
        self._busy = 0  # attempts accepted and not yet ended: waiting in _ready, handed over or running
        # Finished work by partition: each partition's part is committed atomically.
        self._finished: dict[int, Commit] = {}
        self._unsent = Unsent(UNSENT_ACKS)  # commits that failed, sent again at the next flush
        self._tally: Counter[tuple[str, str]] = Counter()
        self._tally_due = 0.0
        self._paused_until = 0.0
        self._commits = Outage(log, f"{provider.channel} acknowledgements", runtime.dependencies)
        # Set when an attempt ends leaving at least `refill` slots free; `_drained` when none is busy.
        self._slot_freed = asyncio.Event()
        self._drained = asyncio.Event()
        # Label lookups resolved once, not several times per attempt.
        self._inflight = metrics.inflight.labels(self.channel)
        self._seconds = metrics.delivery_seconds.labels(self.channel)
        self._outcomes = {kind: source.outcome_counter(self.channel, kind) for kind in OutcomeKind}
        self._retries = metrics.retries_total.labels(self.channel)
        self._deferred = metrics.deferred_total.labels(self.channel)

    async def run(self, stop: asyncio.Event) -> None:
        drained = asyncio.Event()
        flusher = asyncio.create_task(self._flush_loop(drained))
        slots = [asyncio.create_task(self._slot()) for _ in range(self.capacity)]
        outage = Outage(log, f"{self.channel} delivery", self.runtime.dependencies)
        try:
            while not stop.is_set():
                try:
                    await self._read_once()
                    outage.succeeded()
                except Exception as error:
                    # Entries read but not started stay pending and are reclaimed later.
                    await asyncio.sleep(outage.failed(error))
        finally:
            await self._drain()
            self._close_slots(slots)
            # The flusher is told to end, not cancelled: a cancellation landing inside a Redis
            # call can be absorbed by the client, and the loop would then run on forever.
            drained.set()
            await flusher
            await self._flush(final=True)

    async def _read_once(self) -> None:
        if await self._wait_for_pause():
            return  # still paused: the loop looks at `stop`, then waits again
        if self.capacity - self._busy < self.refill:
            self._slot_freed.clear()
            await self._slot_freed.wait()
            return
        free = self.capacity - self._busy
        entries = await self.queue.read(
            self.stream, self.consumer, min(free, FLUSH_SIZE), READ_BLOCK_SECONDS, self.share.partitions
        )
        if entries:
            await self._dispatch(entries)

    async def _wait_for_pause(self) -> bool:
        """Sleep up to a second while the channel is paused; True if it was."""
        remaining = self._paused_until - time.time()
        if remaining > 0:
            await asyncio.sleep(min(remaining, READ_BLOCK_SECONDS))
            return True
        return False

    async def _dispatch(self, entries: list[Entry]) -> None:
        decoded: list[tuple[Entry, Any]] = []
        for entry in entries:
            job = self._decode(entry)
            if job is None:
                self._done(entry).ack.append(entry.id)
            else:
                decoded.append((entry, job))
        key = self.source.key
        targets = await self.source.targets([key(job) for _, job in decoded])
        for entry, job in decoded:
            self._route(entry, job, targets.get(key(job)))

    def _route(self, entry: Entry, job: Any, target: Any) -> None:
        # Each job was made once, by the one fan-out of its envelope (see workers/fanout_worker.py).
        channel = None if target is None else self.source.channel_of(target)
        if channel is None:  # unregistered since, or no channel delivers it now
            self._done(entry).ack.append(entry.id)
            return
        if channel != self.channel:  # re-registered on another channel: hand it over
            done = self._done(entry)
            done.ack.append(entry.id)
            done.add_to(self.source.stream(channel), job.encode())
            return
        self._start(_Work(entry, job, target))

    def _start(self, work: _Work) -> None:
        self._busy += 1  # from now until its slot ends it
        if self._idle:
            self._idle.popleft().set_result(work)
        else:
            self._ready.append(work)

    async def _slot(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._ready:
                work: _Work | None = self._ready.popleft()
            else:
                waiter: asyncio.Future[_Work | None] = loop.create_future()
                self._idle.append(waiter)
                work = await waiter
            if work is None:
                return
            try:
                await self._attempt(work)
            except Exception:
                # Its entry stays pending and is reclaimed later; the slot goes on.
                log.exception("%s delivery attempt failed", self.channel)
            finally:
                self._busy -= 1
                self._slot_ended()

    def _slot_ended(self) -> None:
        if self.capacity - self._busy >= self.refill:
            self._slot_freed.set()
        if self._busy == 0:
            self._drained.set()

    def _close_slots(self, slots: list[asyncio.Task[None]]) -> None:
        while self._idle:
            self._idle.popleft().set_result(None)
        for slot in slots:
            slot.cancel()  # one still sending after the drain's timeout: it is given up

    async def _attempt(self, work: _Work) -> None:
        if self._paused_until > time.time():
            # Read just before the channel was paused: back to the queue until the pause ends,
            # without spending an attempt.
            done = self._done(work.entry)
            done.delay.append(self._delayed(work.job, self._paused_until))
            done.ack.append(work.entry.id)
            self._deferred.inc()
            return
        target = work.target
        started = time.perf_counter()
        outcome = await self.provider.send(self.source.render(self.channel, work.job, target))
        if outcome.kind is not OutcomeKind.DEFERRED:  # not attempted: no latency to tell
            seconds = time.perf_counter() - started
            self._seconds.observe(seconds)
            log_outcome(self.channel, outcome, seconds)
            self._tally[(self.channel, ATTEMPTS)] += 1
            self._tally[(self.channel, ATTEMPT_MS)] += round(seconds * 1000)
            if outcome.credentials_refused:
                self._tally[(self.channel, CREDENTIALS_REFUSED)] += 1
        if self._record(work, outcome):
            await self._delete_dead(self.source.key(work.job), target)
        # Acknowledged only now: a crash before this point repeats the attempt (and the deletion).
        self._done(work.entry).ack.append(work.entry.id)

    def _record(self, work: _Work, outcome: Outcome) -> bool:
        """Queue what follows the attempt; True when the recipient is dead and should be deleted."""
        if outcome.pause_channel and outcome.delay_seconds:
            self._paused_until = max(self._paused_until, time.time() + outcome.delay_seconds)
        job, now = work.job, time.time()
        age = now - job.ingested_ns / 1e9
        step = self.retry.next_step(job, outcome, age)
        if isinstance(step, Retry):
            (self._deferred if outcome.kind is OutcomeKind.DEFERRED else self._retries).inc()
            due = now + step.delay_seconds
            delayed = self._delayed(step.job, due, replaceable=outcome.replaceable)
            self._done(work.entry).delay.append(delayed)
            return False
        self._outcomes[step.kind].inc()
        self._tally[(self.channel, step.kind.value)] += 1
        return step.kind is OutcomeKind.DEAD

    def _decode(self, entry: Entry) -> Any:
        try:
            return self.source.decode(entry.payload)
        except (ValueError, TypeError, KeyError):
            log.error("dropping an undecodable delivery entry")
            return None

    def _done(self, entry: Entry) -> Commit:
        """The finished work of the entry's partition (a retry of a recipient and topic, or a hand-over,
        stays in the partition of its topic, which is its entry's)."""
        commit = self._finished.get(entry.partition)
        if commit is None:
            commit = self._finished[entry.partition] = Commit(partition=entry.partition)
        return commit

    def _delayed(self, job: Any, due: float, *, replaceable: bool = True) -> Delayed:
        key = job.retry_key if replaceable else ""
        return Delayed(self.stream, job.encode(), due, key, self.source.rank(job))

    async def _delete_dead(self, key: Any, target: Any) -> None:
        try:
            deleted = await self.source.forget_if_unchanged(key, target)
        except Exception:
            log.exception("could not forget a dead %s target", self.channel)
            return
        if deleted:
            self.source.count_dead()

    async def _flush_loop(self, drained: asyncio.Event) -> None:
        while not drained.is_set():
            await asyncio.sleep(FLUSH_SECONDS)
            await self._flush()

    async def _flush(self, final: bool = False) -> None:
        # Read off at every flush rather than moved on every attempt.
        self._inflight.set(self._busy)
        now = time.monotonic()
        if self._tally and self.runtime.activity is not None and (final or now >= self._tally_due):
            # Per-minute outcome counts for stats and /status: a round trip a second, not per flush.
            tally, self._tally, self._tally_due = self._tally, Counter(), now + ACTIVITY_SECONDS
            with contextlib.suppress(Exception):  # telemetry only; never blocks delivery
                await self.runtime.activity.record(tally, time.time())
        if not (self._finished or self._unsent):
            return
        commits, self._finished = self._unsent.take(list(self._finished.values())), {}
        try:
            await self.queue.commit_each(self.stream, commits)
            self._commits.succeeded()
        except Exception as error:
            # Sent again at the next flush (one that landed after all applies nothing again). Were
            # the process to stop first, its entries are reclaimed and attempted again: none is lost.
            self._unsent.keep(commits)
            self._commits.failed(error)

    async def _drain(self) -> None:
        if self._busy:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.runtime.settings.provider_timeout_seconds + 5):
                    await self._drained.wait()
