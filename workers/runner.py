"""A worker process: fan-out, one delivery worker per configured XMTP channel, retries, gauges."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from app.delivery.provider import DEFAULT_APP, Provider
from app.queue.backlog import sample_backlog
from app.queue.base import ENVELOPES, WorkQueue, delivery_stream
from app.recipients.targets import RecipientTargets
from app.recipients.types import Channel
from app.runtime import STREAMS, Runtime
from workers.delivery import DeliveryWorker
from workers.fanout import run_fanout
from workers.outage import Outage

log = logging.getLogger(__name__)
PROMOTE_BATCH = 1000
PROMOTE_IDLE_SECONDS = 0.05
GAUGE_SECONDS = 5.0
# Consumers of workers gone this long (with nothing pending) are removed from their groups.
DEAD_CONSUMER_SECONDS = 3600.0
PRUNE_EVERY = 12  # gauge rounds: once a minute


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def run_workers(runtime: Runtime, stop: asyncio.Event) -> None:
    queue = runtime.queue
    if queue is None:
        raise RuntimeError("workers need a queue")
    consumer = consumer_name()
    targets = RecipientTargets(runtime.sessions, runtime.reads)
    providers = xmtp_providers(runtime)
    await asyncio.gather(
        run_fanout(runtime, queue, consumer, stop),
        *(DeliveryWorker(runtime, queue, p, targets, f"{consumer}-{p.channel}").run(stop) for p in providers),
        promote_retries(queue, stop),
        watch_queue(runtime, queue, stop),
    )
    # Stopped cleanly, everything acknowledged: this process's consumer names leave their groups.
    fanout_names = [f"{consumer}-fanout-{n}" for n in range(runtime.settings.fanout_concurrency)]
    with contextlib.suppress(Exception):
        await queue.retire_consumers(ENVELOPES, DEAD_CONSUMER_SECONDS, fanout_names)
        for p in providers:
            await queue.retire_consumers(
                delivery_stream(p.channel), DEAD_CONSUMER_SECONDS, [f"{consumer}-{p.channel}"]
            )


def xmtp_providers(runtime: Runtime) -> list[Provider]:
    """The default app's provider of each XMTP channel this deployment configures."""
    channels = (c.label for c in Channel if c is not Channel.UNSPECIFIED)
    return [p for label in channels if (p := runtime.providers.get(label, DEFAULT_APP)) is not None]


async def promote_retries(queue: WorkQueue, stop: asyncio.Event) -> None:
    """Move retries that are due back onto their channel's stream."""
    outage = Outage(log, "retry promotion")
    while not stop.is_set():
        try:
            moved = await queue.promote_due(time.time(), PROMOTE_BATCH)
            outage.succeeded()
        except Exception as error:
            await _wait(stop, outage.failed(error))
            continue
        if moved < PROMOTE_BATCH:
            await _wait(stop, PROMOTE_IDLE_SECONDS)


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
        await _wait(stop, GAUGE_SECONDS)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
