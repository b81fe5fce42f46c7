"""Scenario `fanout`: one envelope to a topic with many (bulk-inserted) subscribers."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench._processes import Proc
from bench.pipeline.accounting import CpuWindow
from bench.pipeline.analysis import Receipts, analyse, describe_receipts
from bench.pipeline.ingest import IngestLog, Ingestor
from bench.pipeline.processes import Backend, running_backend, running_receiver
from bench.pipeline.receiver_client import ReceiverClient
from bench.pipeline.recipients import Recipient, copy_recipients, make_recipients, make_topics
from bench.pipeline.shared import DELIVERY_STREAM, database, entries_added, errors_suffix, prepare_redis
from bench.pipeline.summary import FANOUT_TARGET_S, Summary, verdict


@dataclass
class QueueWatch:
    """Polls the delivery stream's entries-added every 2 ms until `target` jobs were added."""

    baseline: int
    target: int
    cpu: CpuWindow
    queued_at: int | None = None
    samples: list[tuple[int, int]] = field(default_factory=list)  # (monotonic ns, jobs added since baseline)

    async def run(self, client: Any) -> None:
        while True:
            added = await entries_added(client)
            now = time.monotonic_ns()
            self.samples.append((now, added - self.baseline))
            if added >= self.target:
                self.queued_at = now
                self.cpu.stop()
                return
            await asyncio.sleep(0.002)

    def marks(self, total: int, sent: int) -> list[str]:
        """When 1%, 25%, ... 100% of the jobs were on the stream, in seconds after `sent`."""
        marks = []
        for fraction in (0.01, 0.25, 0.5, 0.75, 1.0):
            goal = int(total * fraction)
            hit = next((t for t, n in self.samples if n >= goal), None)
            marks.append(
                f"{fraction * 100:.0f}% at {(hit - sent) / 1e9:.3f} s"
                if hit
                else f"{fraction * 100:.0f}% never"
            )
        return marks


@dataclass
class Topic:
    topic: bytes
    recipients: list[Recipient]


@dataclass
class FanoutRun:
    log: IngestLog
    sent: int
    cpu: CpuWindow
    watch: QueueWatch | None
    dump: dict[str, Any]


@dataclass
class FanoutOutcome:
    receipts: Receipts
    queued_s: float
    first_s: float
    all_s: float


async def warm_fanout(ingest: Ingestor, receiver: ReceiverClient, warm: Topic) -> None:
    warm_log = await ingest.closed_loop([(warm.topic, 1)], 1, 1)
    count, _ = await receiver.wait_for(len(warm.recipients), stall_seconds=10)
    print(f"warm-up: {count}/{len(warm.recipients)} received (excluded){errors_suffix(warm_log)}")
    await receiver.reset()


async def wait_queued(args: argparse.Namespace, watcher: asyncio.Task[None] | None) -> None:
    if watcher is None:
        return
    try:
        await asyncio.wait_for(watcher, timeout=args.stall + 60)
    except TimeoutError:
        print("fan-out: not every job was queued in time", file=sys.stderr)


async def measure_fanout(
    args: argparse.Namespace,
    backend: Backend,
    receiver: ReceiverClient,
    ingest: Ingestor,
    pids: dict[str, int],
    redis_client: Any,
    big: Topic,
) -> FanoutRun:
    baseline = await entries_added(redis_client) if redis_client is not None else 0
    cpu = CpuWindow(pids)
    queue_cpu = CpuWindow({p.name: p.pid for p in backend.workers})
    watch = QueueWatch(baseline, baseline + len(big.recipients), queue_cpu)
    watcher = asyncio.create_task(watch.run(redis_client)) if redis_client is not None else None
    log = await ingest.closed_loop([(big.topic, 2)], 1, 1)
    sent = log.sent_ns.get(2)
    if sent is None:
        raise RuntimeError(f"the fan-out envelope was refused: {dict(log.errors)}")
    await wait_queued(args, watcher)
    if not args.queue_only:
        await receiver.wait_for(len(big.recipients), stall_seconds=args.stall)
    cpu.stop()
    return FanoutRun(log, sent, cpu, watch if redis_client is not None else None, await receiver.dump())


def print_queueing(run: FanoutRun, total: int, summary: Summary) -> None:
    if run.watch is None:
        print("delivery jobs queued: not observable in memory mode (in-process queue); see receipts")
        return
    marks = run.watch.marks(total, run.sent)
    print(f"delivery jobs queued (XINFO STREAM entries-added of {DELIVERY_STREAM}): " + ", ".join(marks))
    if run.watch.queued_at:
        queue_cpu = run.watch.cpu
        used = sum(v for n, v in queue_cpu.seconds.items() if n.startswith("worker"))
        print(
            f"worker CPU while queueing: {used:.2f} s over {queue_cpu.wall:.2f} s "
            f"({used / queue_cpu.wall * 100:.0f}% of one core; the rest of the time it was "
            "waiting for a core, the database or Redis)"
        )
        summary.add("worker CPU seconds used while queueing", f"{used:.2f} s", value=used, unit="s")


def report_fanout(
    args: argparse.Namespace, run: FanoutRun, big: Topic, keys: dict[bytes, bytes], summary: Summary
) -> FanoutOutcome:
    expected = {(r.id, 2) for r in big.recipients}
    if args.queue_only:  # only what had arrived by the time every job was queued
        expected = {(bytes.fromhex(rid), seq) for rid, _, seq, _ in run.dump["records"]}
    receipts = analyse(run.dump, expected, run.log.sent_ns, keys)
    queued_at = run.watch.queued_at if run.watch is not None else None
    queued_s = (queued_at - run.sent) / 1e9 if queued_at else math.nan
    first_s = (receipts.first_arrival - run.sent) / 1e9 if receipts.unique else math.nan
    all_s = (receipts.last_arrival - run.sent) / 1e9 if receipts.unique else math.nan
    print(describe_receipts(receipts))
    print_queueing(run, len(big.recipients), summary)
    print(
        f"receipts: first after {first_s:.3f} s, all after {all_s:.3f} s "
        f"({receipts.unique / all_s:,.0f} deliveries/s)"
    )
    print(run.cpu.describe())
    return FanoutOutcome(receipts, queued_s, first_s, all_s)


def summarize_fanout(summary: Summary, big: Topic, outcome: FanoutOutcome) -> None:
    queued = not math.isnan(outcome.queued_s)
    receipts = outcome.receipts
    summary.add("subscribers", f"{len(big.recipients):,}", value=len(big.recipients))
    summary.add(
        "ingest -> all delivery jobs queued",
        f"{outcome.queued_s:.3f} s" if queued else "n/a (memory)",
        f"<= {FANOUT_TARGET_S:g} s",
        verdict(outcome.queued_s <= FANOUT_TARGET_S) if queued else "",
        value=outcome.queued_s,
        unit="s",
        key="queued_s",
    )
    summary.add("ingest -> first receipt", f"{outcome.first_s:.3f} s", value=outcome.first_s, unit="s")
    summary.add(
        "ingest -> all received", f"{outcome.all_s:.3f} s", value=outcome.all_s, unit="s", key="all_s"
    )
    summary.add(
        "received / missing / duplicates",
        f"{receipts.unique} / {receipts.missing} / {receipts.duplicates}",
        "no loss",
        verdict(receipts.missing == 0),
        value=receipts.unique,
        key="received",
    )


async def scenario_fanout(args: argparse.Namespace, summary: Summary) -> None:
    topic, warm_topic = make_topics(2)
    big = Topic(topic, make_recipients(args.subscribers, [topic]))
    warm = Topic(warm_topic, make_recipients(args.fanout_warmup, [warm_topic]))
    keys = {r.id: r.key for r in [*big.recipients, *warm.recipients]}
    print(
        f"load: one envelope to a topic with {args.subscribers:,} HTTP subscribers (bulk-inserted), after a "
        f"warm-up envelope to a topic with {len(warm.recipients)}"
    )
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        hook = f"http://127.0.0.1:{port}/hook"
        took = await copy_recipients(database_url, [*big.recipients, *warm.recipients], hook)
        print(
            f"bulk insert: {len(big.recipients) + len(warm.recipients):,} recipients + subscriptions in {took:.1f} s"
        )
        run = await run_fanout(args, database_url, redis_url, redis_client, port, receiver_proc, big, warm)
        outcome = report_fanout(args, run, big, keys, summary)
        if redis_client is not None:
            await redis_client.aclose()
    summarize_fanout(summary, big, outcome)


async def run_fanout(
    args: argparse.Namespace,
    database_url: str,
    redis_url: str | None,
    redis_client: Any,
    port: int,
    receiver_proc: Proc,
    big: Topic,
    warm: Topic,
) -> FanoutRun:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        running_backend(args, database_url, redis_url) as backend,
    ):
        receiver = ReceiverClient(session, port)
        ingest = Ingestor(session, backend.http_port)
        await warm_fanout(ingest, receiver, warm)
        pids = {p.name: p.pid for p in backend.procs} | {"receiver": receiver_proc.pid}
        return await measure_fanout(args, backend, receiver, ingest, pids, redis_client, big)
