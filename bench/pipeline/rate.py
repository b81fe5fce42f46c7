"""Scenarios `latency` and `soak`: open loop at a fixed rate of hints, latency per window, backend RSS."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench._proc import rss_mb
from bench._processes import Proc
from bench.pipeline.accounting import CpuWindow
from bench.pipeline.analysis import Receipts, analyse, by_window, describe_latency, describe_receipts, ms
from bench.pipeline.ingest import IngestLog
from bench.pipeline.processes import running_backend, running_receiver
from bench.pipeline.receiver_client import ReceiverClient
from bench.pipeline.shared import (
    Load,
    add_series,
    build_load,
    database,
    errors_suffix,
    prepare_redis,
    registered_ingestor,
)
from bench.pipeline.summary import LATENCY_P99_TARGET_MS, RSS_TARGET_MB, Summary, verdict


@dataclass
class RssSampler:
    """VmRSS of the backend processes every `every` s (printed as it goes in soak runs)."""

    watched: dict[str, int]
    receiver: ReceiverClient
    every: float
    verbose: bool
    started: float = field(default_factory=time.monotonic)
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.samples = {name: [] for name in self.watched}

    def sample(self) -> None:
        for name, pid in self.watched.items():
            self.samples[name].append((time.monotonic() - self.started, rss_mb(pid)))

    async def run(self) -> None:
        while True:
            self.sample()
            if self.verbose:
                line = ", ".join(f"{n} {self.samples[n][-1][1]:.1f} MB" for n in self.watched)
                print(
                    f"  t={time.monotonic() - self.started:5.0f} s  RSS: {line}  "
                    f"received {await self.receiver.count()}",
                    flush=True,
                )
            await asyncio.sleep(self.every)


@dataclass
class RateRun:
    log: IngestLog
    cpu: CpuWindow
    rss: dict[str, list[tuple[float, float]]]
    dump: dict[str, Any]


def envelope_rate(args: argparse.Namespace) -> float:
    return args.rate / (args.subscribers / args.topics)


def print_load(args: argparse.Namespace, load: Load) -> None:
    subs_per_topic = args.subscribers / args.topics
    per_request = envelope_rate(args) * args.tick
    print(
        f"load: {args.rate:g} hints/s for {args.duration:g} s = {envelope_rate(args):g} envelopes/s to {args.topics} topics "
        f"x {subs_per_topic:g} subscribers; open loop, one ingest request every {args.tick * 1000:g} ms "
        f"({per_request:g} envelopes each); {len(load.plan)} deliveries"
    )


async def measure_rate(
    args: argparse.Namespace,
    database_url: str,
    redis_url: str | None,
    port: int,
    receiver_proc: Proc,
    load: Load,
) -> RateRun:
    hook = f"http://127.0.0.1:{port}/hook"
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        running_backend(args, database_url, redis_url) as backend,
    ):
        receiver = ReceiverClient(session, port)
        ingest = await registered_ingestor(args, backend, session, receiver, load, hook)
        watched = {p.name: p.pid for p in backend.procs}
        rss = RssSampler(watched, receiver, args.rss_every, verbose=args.scenario == "soak")
        sampler = asyncio.create_task(rss.run())
        cpu = CpuWindow(watched | {"receiver": receiver_proc.pid})
        log = await ingest.open_loop(load.envelopes, envelope_rate(args), args.tick)
        await receiver.wait_for(len(load.plan), stall_seconds=args.stall)
        cpu.stop()
        rss.sample()
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        return RateRun(log, cpu, rss.samples, await receiver.dump())


def issued_rate(args: argparse.Namespace, log: IngestLog) -> float:
    """Hints/s the open loop actually issued."""
    return (
        (len(log.sent_ns) - 1) / ((log.last_sent - log.first_sent) / 1e9) * (args.subscribers / args.topics)
    )


def print_ingest(args: argparse.Namespace, log: IngestLog) -> None:
    lag = sorted(log.start_lag)
    requests = sorted(log.request_seconds)
    print(
        f"ingest: {len(log.sent_ns)} envelopes in {len(log.request_seconds)} requests, issued at "
        f"{issued_rate(args, log):,.0f} hints/s; request time p50 {ms(requests, 50) * 1000:.1f} ms, "
        f"p99 {ms(requests, 99) * 1000:.1f} ms; send lag p99 {ms(lag, 99) * 1000:.1f} ms"
        f"{errors_suffix(log)}"
    )


def print_windows(receipts: Receipts, window: float) -> None:
    print(f"per {window:g} s window of arrival (p50 / p99 / max ms):")
    origin = receipts.latency_by_arrival[0][0] if receipts.latency_by_arrival else 0
    buckets = by_window(receipts.latency_by_arrival, origin, window)
    for index in sorted(buckets):
        values = sorted(buckets[index])
        print(
            f"  {index * window:6.0f}..{(index + 1) * window:<6.0f} s  n={len(values):7d}  "
            f"{ms(values, 50):7.1f} / {ms(values, 99):7.1f} / {values[-1]:7.1f}"
        )


def print_rss(args: argparse.Namespace, rss: dict[str, list[tuple[float, float]]]) -> None:
    for name, samples in rss.items():
        values = [v for _, v in samples]
        print(
            f"RSS {name}: first {values[0]:.1f} MB, last {values[-1]:.1f} MB, min {min(values):.1f} MB, "
            f"max {max(values):.1f} MB over {len(values)} samples every {args.rss_every:g} s"
        )


def report_rate(args: argparse.Namespace, run: RateRun, load: Load) -> Receipts:
    receipts = analyse(run.dump, load.expected, run.log.sent_ns, load.keys)
    window = args.window or (60.0 if args.scenario == "soak" else 10.0)
    print(describe_receipts(receipts))
    print_ingest(args, run.log)
    print(describe_latency(receipts.latencies_ms))
    print_windows(receipts, window)
    print(run.cpu.describe())
    print_rss(args, run.rss)
    return receipts


def summarize_latency(
    args: argparse.Namespace, summary: Summary, log: IngestLog, load: Load, receipts: Receipts
) -> None:
    values = receipts.latencies_ms
    issued = issued_rate(args, log)
    summary.add(
        "hints/s offered / issued",
        f"{args.rate:g} / {issued:,.0f}",
        value=issued,
        unit="hints/s",
        key="issued_per_s",
    )
    summary.info["offered_per_s"] = args.rate
    summary.add(
        "deliveries expected / received",
        f"{len(load.plan)} / {receipts.unique}",
        "all",
        verdict(receipts.missing == 0),
        value=receipts.unique,
        key="received",
    )
    summary.add("duplicates", f"{receipts.duplicates}", value=receipts.duplicates)
    summary.add(
        "ingest->receipt p50", f"{ms(values, 50):.1f} ms", value=ms(values, 50), unit="ms", key="p50_ms"
    )
    summary.add(
        "ingest->receipt p99",
        f"{ms(values, 99):.1f} ms",
        f"< {LATENCY_P99_TARGET_MS:g} ms",
        verdict(ms(values, 99) < LATENCY_P99_TARGET_MS),
        value=ms(values, 99),
        unit="ms",
        key="p99_ms",
    )
    summary.add(
        "ingest->receipt max",
        f"{values[-1]:.1f} ms" if values else "n/a",
        value=values[-1] if values else None,
        unit="ms",
    )


def summarize_rss(
    args: argparse.Namespace, summary: Summary, rss: dict[str, list[tuple[float, float]]]
) -> None:
    worker_names = [n for n in rss if n.startswith("worker")] or ["dev"]
    for name in worker_names:
        mb = [v for _, v in rss[name]]
        summary.add(
            f"RSS {name} min / max",
            f"{min(mb):.1f} / {max(mb):.1f} MB",
            f"< {RSS_TARGET_MB:g} MB, flat",
            verdict(max(mb) < RSS_TARGET_MB),
            value=max(mb),
            unit="MB",
        )
        if args.scenario == "soak":
            half = len(mb) // 2
            growth = max(mb[half:]) - min(mb[half:])
            summary.add(f"RSS {name} 2nd-half growth", f"{growth:.1f} MB", value=growth, unit="MB")
    if "api" in rss:
        mb = [v for _, v in rss["api"]]
        summary.add("RSS api min / max", f"{min(mb):.1f} / {max(mb):.1f} MB", value=max(mb), unit="MB")


async def scenario_rate(args: argparse.Namespace, summary: Summary) -> None:
    load = build_load(args.subscribers, args.topics, int(envelope_rate(args) * args.duration))
    print_load(args, load)
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        run = await measure_rate(args, database_url, redis_url, port, receiver_proc, load)
        receipts = report_rate(args, run, load)
        add_series(summary, receipts, run.log.first_sent)
        if redis_client is not None:
            await redis_client.aclose()
    summarize_latency(args, summary, run.log, load, receipts)
    summarize_rss(args, summary, run.rss)
