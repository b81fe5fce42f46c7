"""Set-up shared by the scenarios: database, Redis, the header lines, the delivery plan and the warm-up."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench._proc import load_average
from bench._support import bench_database, environment_line
from bench.pipeline.analysis import Receipts, time_series
from bench.pipeline.ingest import IngestLog, Ingestor
from bench.pipeline.processes import Backend
from bench.pipeline.receiver_client import ReceiverClient
from bench.pipeline.recipients import Recipient, make_recipients, make_topics, register_over_grpc
from bench.pipeline.summary import Summary

DELIVERY_STREAM = "xmtp-push:deliveries.http"


@contextlib.asynccontextmanager
async def database(args: argparse.Namespace) -> AsyncIterator[str]:
    if args.db == "sqlite":
        from app.core.config import Settings
        from app.core.migrations import upgrade

        folder = tempfile.mkdtemp(prefix="xmtp-push-bench-")
        url = f"sqlite+aiosqlite:///{folder}/bench.db"
        await asyncio.to_thread(upgrade, Settings(database_url=url))
        print(f"database: SQLite {folder}/bench.db, migrated")
        try:
            yield url
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        async with bench_database(args.admin_dsn, keep=args.keep_db) as url:
            yield url


async def prepare_redis(args: argparse.Namespace) -> tuple[str | None, Any]:
    if args.mode != "redis":
        return None, None
    from redis.asyncio import Redis

    url = f"redis://127.0.0.1:{args.redis_port}/{args.redis_db}"
    client = Redis.from_url(url)
    await client.flushdb()
    print(f"redis: {url} (FLUSHDB done)")
    return url, client


async def entries_added(client: Any, key: str = DELIVERY_STREAM) -> int:
    try:
        info = await client.xinfo_stream(key)
    except Exception:  # the stream does not exist yet
        return 0
    value = info.get("entries-added", info.get(b"entries-added"))
    if value is None:
        raise RuntimeError("XINFO STREAM has no entries-added (needs Redis 7.0+)")
    return int(value)


def header(args: argparse.Namespace) -> None:
    print(environment_line())
    print(
        f"host load average at start: {load_average()} "
        "(other processes on the host share the 2 cores; see 'other' in the cpu lines)"
    )
    workers = f", {args.workers} worker process(es)" if args.mode == "redis" else " (one `xmtp-push dev`)"
    print(f"mode: {args.mode}{workers}; scenario: {args.scenario}; database: {args.db}")
    if args.env:
        print(f"extra backend settings: {' '.join(args.env)}")


def delivery_plan(
    recipients: Sequence[Recipient], envelopes: Sequence[tuple[bytes, int]]
) -> list[tuple[Recipient, int]]:
    by_topic: dict[bytes, list[Recipient]] = collections.defaultdict(list)
    for recipient in recipients:
        by_topic[recipient.topic].append(recipient)
    return [(r, seq) for topic, seq in envelopes for r in by_topic[topic]]


async def warm_up(
    ingest: Ingestor,
    receiver: ReceiverClient,
    recipients: Sequence[Recipient],
    topics: Sequence[bytes],
    first_seq: int,
) -> int:
    """A few envelopes through the whole pipeline (connections, pools, prepared statements); returns next seq."""
    per_topic = collections.Counter(r.topic for r in recipients)
    warm_topics = list(topics[: min(len(topics), 20)])
    envelopes = [(topic, first_seq + i) for i, topic in enumerate(warm_topics)]
    expected = sum(per_topic[t] for t in warm_topics)
    log = await ingest.closed_loop(envelopes, batch=len(envelopes), concurrency=1)
    count, _ = await receiver.wait_for(expected, stall_seconds=10)
    print(
        f"warm-up: {len(envelopes)} envelopes, {count}/{expected} deliveries received (excluded){errors_suffix(log)}"
    )
    await receiver.reset()
    return first_seq + len(envelopes)


def errors_suffix(log: IngestLog) -> str:
    return f"; ingest errors {dict(log.errors)}" if log.errors else ""


@dataclass
class Load:
    """The recipients, spread round-robin over the topics, and the envelopes round-robin over the topics."""

    topics: list[bytes]
    recipients: list[Recipient]
    keys: dict[bytes, bytes]
    envelopes: list[tuple[bytes, int]]
    plan: list[tuple[Recipient, int]]
    expected: set[tuple[bytes, int]]


def build_load(subscribers: int, topic_count: int, envelope_count: int) -> Load:
    topics = make_topics(topic_count)
    recipients = make_recipients(subscribers, topics)
    envelopes = [(topics[j % len(topics)], 1_000_000 + j) for j in range(envelope_count)]
    plan = delivery_plan(recipients, envelopes)
    return Load(
        topics=topics,
        recipients=recipients,
        keys={r.id: r.key for r in recipients},
        envelopes=envelopes,
        plan=plan,
        expected={(r.id, seq) for r, seq in plan},
    )


async def registered_ingestor(
    args: argparse.Namespace,
    backend: Backend,
    session: aiohttp.ClientSession,
    receiver: ReceiverClient,
    load: Load,
    hook: str,
) -> Ingestor:
    """Register the load's recipients over gRPC, then warm the pipeline up; the ingestor to measure with."""
    took = await register_over_grpc(backend.grpc_port, load.recipients, hook, args.register_concurrency)
    print(f"registration: {len(load.recipients)} Register + UpdateSubscriptions over gRPC in {took:.1f} s")
    ingest = Ingestor(session, backend.http_port)
    await warm_up(ingest, receiver, load.recipients, load.topics, first_seq=1)
    return ingest


def add_series(summary: Summary, receipts: Receipts, origin: int) -> None:
    """The per-window deliveries/s and latency, counted from `origin` (the first ingest send), for --json."""
    width, rows = time_series(receipts.latency_by_arrival, origin)
    summary.series["windows"] = rows
    summary.info["series_window_s"] = width
