"""A worker process: fan-out, one delivery worker per configured XMTP channel, retries, gauges."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from app.core.apps import DEFAULT_APP
from app.core.channels import Channel
from app.core.dependencies import DependencyLog
from app.delivery.provider import Provider
from app.legacy.deliveries import LegacyDeliveries, payload_settings
from app.legacy.fanout import LegacyFanout, channel_chooser
from app.legacy.payloads import HTTP_DELIVERY_APP
from app.queue.backlog import sample_backlog
from app.queue.base import ENVELOPES, Share, WorkQueue, delivery_stream
from app.queue.ownership import PartitionOwnership
from app.recipients.targets import RecipientTargets
from app.recipients.types import DELIVERY_CHANNELS
from app.runtime import STREAMS, Runtime
from workers.delivery_worker import DeliveryWorker, XmtpDeliveries
from workers.fanout_worker import run_fanout
from workers.outage import Outage, pause

log = logging.getLogger(__name__)
PROMOTE_BATCH = 1000
# Each round asks every partition of the share: not more often than this while nothing is due.
PROMOTE_IDLE_SECONDS = 0.1
GAUGE_SECONDS = 5.0
# Consumers of workers gone this long (with nothing pending) are removed from their groups.
DEAD_CONSUMER_SECONDS = 3600.0
PRUNE_EVERY = 12  # gauge rounds: once a minute


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def run_workers(runtime: Runtime, stop: asyncio.Event, share: Share | None = None) -> None:
    """Every loop of a worker over the partitions of `share` (None: all of them): fan-out, delivery
    and retry promotion read only those; the gauges and the pruning of consumers see them all."""
    queue = runtime.queue
    if queue is None:
        raise RuntimeError("workers need a queue")
    consumer = consumer_name()
    ownership = None if share is not None else worker_ownership(runtime, queue, consumer)
    share = share or Share.everything(queue.partitions)
    targets = RecipientTargets(runtime.sessions, runtime.reads)
    providers = xmtp_providers(runtime)
    legacy = legacy_workers(runtime, queue, consumer, share)
    await asyncio.gather(
        run_fanout(runtime, queue, consumer, share, stop),
        *(
            DeliveryWorker(runtime, queue, p, XmtpDeliveries(targets), f"{consumer}-{p.channel}", share).run(
                stop
            )
            for p in providers
        ),
        *(legacy.loops(runtime, queue, consumer, share, stop) if legacy else ()),
        promote_retries(queue, share, stop, runtime.dependencies),
        watch_queue(runtime, queue, stop),
        *([keep_share(ownership, share, stop, runtime.dependencies)] if ownership else []),
    )
    if ownership is not None:
        with contextlib.suppress(Exception):
            await ownership.leave()  # its partitions go to the others at their next beat
    # Stopped cleanly, everything acknowledged: this process's consumer names leave their groups.
    fanout_names = [f"{consumer}-fanout-{n}" for n in range(runtime.settings.fanout_concurrency)]
    with contextlib.suppress(Exception):
        await queue.retire_consumers(ENVELOPES, DEAD_CONSUMER_SECONDS, fanout_names)
        for p in providers:
            await queue.retire_consumers(
                delivery_stream(p.channel), DEAD_CONSUMER_SECONDS, [f"{consumer}-{p.channel}"]
            )


def worker_ownership(runtime: Runtime, queue: WorkQueue, consumer: str) -> PartitionOwnership | None:
    """This worker's membership among the workers sharing the Redis queue (None in process: alone).
    Its lease is half the reclaim period, so a dead worker's partitions have a reader again by the
    time its pending entries have been idle long enough to be reclaimed."""
    link = getattr(queue, "link", None)
    if link is None:
        return None
    lease = runtime.settings.queue_reclaim_seconds / 2
    return PartitionOwnership(link, consumer, queue.partitions, lease)


async def keep_share(
    ownership: PartitionOwnership, share: Share, stop: asyncio.Event, dependencies: DependencyLog
) -> None:
    """Beat, and set the share to the partitions this worker owns whenever they change; with Redis
    away the share stays as it was."""
    outage = Outage(log, "partition ownership", dependencies)
    while not stop.is_set():
        try:
            owned = tuple(sorted(await ownership.beat()))
            outage.succeeded()
        except Exception as error:
            await pause(stop, outage.failed(error))
            continue
        if owned != share.partitions:
            share.partitions = owned
            log.info(
                "worker reads %d of %d partitions (%d workers)",
                len(owned), ownership.partitions, len(ownership.members),
            )  # fmt: skip
        await pause(stop, ownership.beat_seconds)


@dataclass(frozen=True, slots=True)
class LegacyWorkers:
    fanout: LegacyFanout
    deliveries: list[DeliveryWorker]

    def loops(
        self, runtime: Runtime, queue: WorkQueue, consumer: str, share: Share, stop: asyncio.Event
    ) -> list[Coroutine[Any, Any, None]]:
        fanout = run_fanout(runtime, queue, consumer, share, stop, self.fanout)
        return [fanout, *(worker.run(stop) for worker in self.deliveries)]


def legacy_workers(runtime: Runtime, queue: WorkQueue, consumer: str, share: Share) -> LegacyWorkers | None:
    """The legacy source's fan-out and a delivery worker per channel it pushes by, when it is on:
    APNs and FCM through their default apps, the HTTP delivery through its own."""
    settings = runtime.settings
    if not settings.legacy_api_enabled:
        return None
    apns = runtime.providers.get(Channel.APNS, DEFAULT_APP)
    fcm = runtime.providers.get(Channel.FCM, DEFAULT_APP)
    http = runtime.providers.get(Channel.HTTP, HTTP_DELIVERY_APP)
    channel_of = channel_chooser(apns=apns is not None, fcm=fcm is not None, http=http is not None)
    payloads = payload_settings(settings)
    fanout = LegacyFanout(
        runtime.legacy_rules, settings.fanout_page_size, channel_of, settings.fanout_ranges, payloads
    )
    source = LegacyDeliveries(runtime.sessions, runtime.reads, runtime.legacy_rules, channel_of, payloads)
    deliveries = [
        DeliveryWorker(runtime, queue, p, source, f"{consumer}-legacy-{p.channel}", share)
        for p in (apns, fcm, http)
        if p is not None
    ]
    return LegacyWorkers(fanout, deliveries)


def xmtp_providers(runtime: Runtime) -> list[Provider]:
    """The default app's provider of each XMTP channel this deployment configures."""
    channels = DELIVERY_CHANNELS.values()
    return [p for channel in channels if (p := runtime.providers.get(channel, DEFAULT_APP)) is not None]


async def promote_retries(
    queue: WorkQueue, share: Share, stop: asyncio.Event, dependencies: DependencyLog
) -> None:
    """Move retries that are due back onto their channel's stream, in the share's partitions."""
    outage = Outage(log, "retry promotion", dependencies)
    while not stop.is_set():
        try:
            moved = await queue.promote_due(time.time(), PROMOTE_BATCH, share.partitions)
            outage.succeeded()
        except Exception as error:
            await pause(stop, outage.failed(error))
            continue
        if moved < PROMOTE_BATCH:
            await pause(stop, PROMOTE_IDLE_SECONDS)


async def watch_queue(runtime: Runtime, queue: WorkQueue, stop: asyncio.Event) -> None:
    """The backlog every few seconds, kept per minute for /status; once a minute, the consumers of
    workers long gone are pruned."""
    rounds = 0
    while not stop.is_set():
        with contextlib.suppress(Exception):
            depths = await sample_backlog(queue, STREAMS)
            if runtime.activity is not None:
                await runtime.activity.record_backlog(depths, time.time())
            if rounds % PRUNE_EVERY == 0:
                for stream in STREAMS:
                    await queue.retire_consumers(stream, DEAD_CONSUMER_SECONDS)
        rounds += 1
        await pause(stop, GAUGE_SECONDS)
