"""Scenario `throughput`: the bare loop, then ours (ingest -> fan-out -> delivery -> receiver), the same hints."""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench._processes import Proc
from bench._support import service_collector
from bench.pipeline.accounting import CpuWindow
from bench.pipeline.analysis import Receipts, analyse, describe_latency, describe_receipts, ms, steady_rate
from bench.pipeline.bare import bare_loop
from bench.pipeline.ingest import IngestLog
from bench.pipeline.processes import Backend, running_backend, running_receiver
from bench.pipeline.receiver_client import ReceiverClient
from bench.pipeline.recipients import Recipient
from bench.pipeline.shared import (
    Load,
    add_series,
    build_load,
    database,
    errors_suffix,
    prepare_redis,
    registered_ingestor,
)
from bench.pipeline.summary import RATIO_TARGET, Summary, verdict


@dataclass
class Bare:
    rate: float = math.nan  # posts/s
    us: float = math.nan  # client CPU per post


@dataclass
class Ours:
    log: IngestLog
    cpu: CpuWindow
    dump: dict[str, Any]


@dataclass
class Outcome:
    receipts: Receipts
    rate: float  # deliveries/s, first ingest send -> last receipt
    steady: float  # deliveries/s, 10%..90% of receipts
    us: float  # backend CPU per delivery


def print_load(args: argparse.Namespace, load: Load) -> None:
    subs_per_topic = args.subscribers / args.topics
    print(
        f"load: {args.subscribers} HTTP recipients over {args.topics} topics ({subs_per_topic:g} per topic), "
        f"{args.envelopes} envelopes -> {len(load.plan)} deliveries; ingest "
        + (
            f"open loop at {args.rate:g} hints/s"
            if args.rate
            else f"as fast as possible, batches of {args.batch}, {args.ingest_concurrency} requests in flight"
        )
    )


async def measure_bare(
    args: argparse.Namespace,
    port: int,
    receiver: ReceiverClient,
    receiver_proc: Proc,
    plan: list[tuple[Recipient, int]],
) -> Bare:
    print()
    print(
        f"== bare loop: aiohttp on {type(asyncio.get_running_loop()).__module__.split('.')[0]}, shared session, "
        f"{args.bare_concurrency} in flight, Standard Webhooks signing by hmac.digest (checked against the library) =="
    )
    with service_collector() as collector:
        print(f"bare loop collector: {collector}")
        cpu = CpuWindow({"receiver": receiver_proc.pid})
        elapsed, ok, errors = await bare_loop(port, plan, args.bare_concurrency)
        cpu.stop()
    bare = Bare(ok / elapsed, cpu.seconds["bench"] / max(1, ok) * 1e6)
    received = await receiver.count()
    print(
        f"bare loop: {ok} posts ok in {elapsed:.2f} s = {bare.rate:,.0f} posts/s; receiver counted "
        f"{received}; errors {dict(errors) or 0}"
    )
    print(cpu.describe())
    print(
        f"bare loop CPU: {bare.us:.0f} us per post (client process), receiver "
        f"{cpu.seconds['receiver'] / max(1, ok) * 1e6:.0f} us per post"
    )
    await receiver.reset()
    return bare


async def measure_ours(
    args: argparse.Namespace,
    backend: Backend,
    session: aiohttp.ClientSession,
    receiver: ReceiverClient,
    receiver_proc: Proc,
    load: Load,
    hook: str,
) -> Ours:
    print()
    print("== ours: ingest -> fan-out -> delivery -> receiver ==")
    ingest = await registered_ingestor(args, backend, session, receiver, load, hook)
    pids = {p.name: p.pid for p in backend.procs} | {"receiver": receiver_proc.pid}
    cpu = CpuWindow(pids)
    if args.rate:
        log = await ingest.open_loop(load.envelopes, args.rate / (args.subscribers / args.topics), args.tick)
    else:
        log = await ingest.closed_loop(load.envelopes, args.batch, args.ingest_concurrency)
    ingest_s = (log.last_done - log.first_sent) / 1e9
    print(
        f"ingest: {len(log.sent_ns)} envelopes accepted in {ingest_s:.2f} s "
        f"({len(log.request_seconds)} requests){errors_suffix(log)}"
    )
    await receiver.wait_for(len(load.plan), stall_seconds=args.stall)
    cpu.stop()
    return Ours(log, cpu, await receiver.dump())


def report_ours(load: Load, run: Ours) -> Outcome:
    receipts = analyse(run.dump, load.expected, run.log.sent_ns, load.keys)
    elapsed = (receipts.last_arrival - run.log.first_sent) / 1e9 if receipts.unique else math.nan
    ours = receipts.unique / elapsed if receipts.unique else 0.0
    steady = steady_rate(receipts.arrivals)
    print(describe_receipts(receipts))
    print(
        f"throughput: {receipts.unique} deliveries in {elapsed:.2f} s (first ingest send -> last receipt) = "
        f"{ours:,.0f} deliveries/s; steady (10%..90% of receipts) {steady:,.0f}/s"
    )
    print(describe_latency(receipts.latencies_ms))
    print(run.cpu.describe())
    seconds = run.cpu.seconds
    backend_s = sum(v for n, v in seconds.items() if n.startswith(("worker", "dev", "api")))
    worker_s = sum(v for n, v in seconds.items() if n.startswith(("worker", "dev")))
    ours_us = backend_s / max(1, receipts.unique) * 1e6
    print(
        f"backend CPU: {ours_us:.0f} us per delivery (api + workers; workers alone "
        f"{worker_s / max(1, receipts.unique) * 1e6:.0f} us)"
    )
    return Outcome(receipts, ours, steady, ours_us)


def summarize_delivery(summary: Summary, load: Load, outcome: Outcome, label: str) -> None:
    receipts = outcome.receipts
    summary.add(
        "deliveries expected / received",
        f"{len(load.plan)} / {receipts.unique}",
        "all",
        verdict(receipts.missing == 0),
        value=receipts.unique,
        key="received",
    )
    summary.add(
        "duplicates / unexpected", f"{receipts.duplicates} / {receipts.unexpected}", value=receipts.duplicates
    )
    ok = receipts.samples_checked - receipts.samples_failed
    summary.add(
        "signature samples ok",
        f"{ok}/{receipts.samples_checked}",
        "all",
        verdict(receipts.samples_failed == 0),
        value=ok,
    )
    summary.add(
        f"ours ({label}) deliveries/s, end to end",
        f"{outcome.rate:,.0f}",
        value=outcome.rate,
        unit="deliveries/s",
        key="ours_per_s",
    )
    summary.add(
        "ours deliveries/s, steady 10..90%",
        f"{outcome.steady:,.0f}",
        value=outcome.steady,
        unit="deliveries/s",
        key="ours_steady_per_s",
    )


def summarize_bare(args: argparse.Namespace, summary: Summary, outcome: Outcome, bare: Bare) -> None:
    summary.add(
        f"bare loop posts/s ({args.bare_concurrency} in flight)",
        f"{bare.rate:,.0f}",
        value=bare.rate,
        unit="posts/s",
        key="bare_per_s",
    )
    ratio = outcome.rate / bare.rate if bare.rate else math.nan
    summary.add(
        "ratio ours/bare (end to end)",
        f"{ratio * 100:.0f} %",
        f">= {RATIO_TARGET * 100:.0f} %",
        verdict(ratio >= RATIO_TARGET),
        value=ratio * 100,
        unit="%",
        key="ratio",
    )
    steady = outcome.steady / bare.rate
    summary.add("ratio ours/bare (steady)", f"{steady * 100:.0f} %", value=steady * 100, unit="%")
    summary.add(
        "CPU us per delivery: ours (api+workers) / bare",
        f"{outcome.us:.0f} / {bare.us:.0f}",
        value=outcome.us,
        unit="us",
        key="ours_cpu_us",
    )
    summary.add(
        "CPU-normalised ratio (bare us / ours us)",
        f"{bare.us / outcome.us * 100:.0f} %",
        "",
        "(load-independent)",
        value=bare.us / outcome.us * 100,
        unit="%",
    )


def summarize(args: argparse.Namespace, summary: Summary, load: Load, outcome: Outcome, bare: Bare) -> None:
    label = f"{args.mode}" + (f", {args.workers} worker(s)" if args.mode == "redis" else "")
    summarize_delivery(summary, load, outcome, label)
    if not args.no_bare:
        summarize_bare(args, summary, outcome, bare)
    values = outcome.receipts.latencies_ms
    summary.add(
        "ingest->receipt p50 / p99",
        f"{ms(values, 50):.1f} / {ms(values, 99):.1f} ms",
        "(backlog drain)" if not args.rate else "",
        value=ms(values, 99),
        unit="ms",
        key="p99_ms",
    )


async def scenario_throughput(args: argparse.Namespace, summary: Summary) -> None:
    load = build_load(args.subscribers, args.topics, args.envelopes)
    print_load(args, load)
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        hook = f"http://127.0.0.1:{port}/hook"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            receiver = ReceiverClient(session, port)
            bare = Bare()
            if not args.no_bare:
                bare = await measure_bare(args, port, receiver, receiver_proc, load.plan)
            async with running_backend(args, database_url, redis_url) as backend:
                run = await measure_ours(args, backend, session, receiver, receiver_proc, load, hook)
        outcome = report_ours(load, run)
        add_series(summary, outcome.receipts, run.log.first_sent)
        if redis_client is not None:
            await redis_client.aclose()
    summarize(args, summary, load, outcome, bare)
