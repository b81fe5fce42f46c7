"""Benchmark (not a test): the xmtpd listener's decode + dedupe + enqueue path, on one core.

    python -m bench.listener_decode [--envelopes 200000] [--repeat 3] [--redis-db 14] [--no-redis] [--no-e2e]

Builds a corpus of realistic OriginatorEnvelopes with the real nested layers (app/testing/fake_xmtpd.py
builders): mostly group messages (an MLS PrivateMessage of about 200 bytes, a 32-byte sender_hmac,
should_push), some commits (PublicMessage from originator 0 with a blockchain proof), welcomes,
identity updates and key packages, from a few originators with their own sequence ids. They are packed
into SubscribeEnvelopesResponse batches of 50-500, serialized, as a node sends them.

Measured, each over the whole corpus, best of --repeat runs:
- `memory`: every response parsed from its bytes (what the gRPC deserializer does) and handed to
  `workers.listener.Listener._ingest` with the in-process MemoryQueue: decode of every layer, MLS
  commit detection, dedupe, fan-out job encoding, queueing, marks.
- `redis`: the same with RedisQueue on Redis DB --redis-db (default 14; FLUSHDB before and after; the
  run refuses a DB that holds keys other than this project's `xmtp-push:*` or that another client has
  selected).
- `e2e`: a fake xmtpd (app.testing.fake_xmtpd.FakeXmtpd) in a subprocess streams the corpus over a real
  port to the real `run_listener` (in-process queue) in this process; from the first envelope counted
  until all are counted by the listener and every pushable one is on the queue.

The listener's marks go to a throw-away migrated SQLite file (at most once a second, as in production).
Target: at least 20,000 envelopes per second decoded and queued on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from redis.asyncio import Redis

from app.core.config import Settings
from app.core.migrations import upgrade
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2 as api
from app.queue.base import ENVELOPES
from app.runtime import Runtime, open_runtime
from app.testing.fake_xmtpd import (
    APPLICATION,
    FakeXmtpd,
    Item,
    commit_message,
    group_message,
    group_topic,
    identity_update,
    key_package,
    private_message,
    welcome_message,
    welcome_topic,
)
from bench._results import Results
from bench._results import verdict as meets
from bench._support import environment_line
from workers.listener import Listener, run_listener

TARGET_PER_SECOND = 20_000
REDIS_URL = os.environ.get("XMTP_PUSH_BENCH_REDIS", "redis://127.0.0.1:6379")
# Share of each kind, in percent of the corpus.
MIX = {"group_message": 83, "commit": 2, "welcome": 5, "identity_update": 5, "key_package": 5}
NODES = (100, 200, 300)


# --- the corpus ---------------------------------------------------------------------------------------


@dataclass
class Corpus:
    responses: list[bytes]  # serialized SubscribeEnvelopesResponse, as on the wire
    envelopes: int
    pushable: int
    kinds: Counter[str]
    wire_bytes: int


def build_corpus(count: int, min_batch: int, max_batch: int, seed: int) -> Corpus:
    rng = random.Random(seed)
    group_topics = [group_topic(rng.randbytes(16)) for _ in range(5_000)]
    welcome_topics = [welcome_topic() for _ in range(2_000)]
    kinds = [kind for kind, share in MIX.items() for _ in range(share)]
    sequences: Counter[int] = Counter()
    now = time.time_ns()
    items: list[Item] = []
    tally: Counter[str] = Counter()
    for _ in range(count):
        kind = rng.choice(kinds)
        node = 0 if kind == "commit" else rng.choice(NODES)
        sequences[node] += 1
        sequence = sequences[node]
        if kind == "group_message":
            topic = rng.choice(group_topics)
            data = private_message(APPLICATION, group_id=topic[1:], ciphertext_size=rng.randint(130, 150))
            item = group_message(
                node, sequence, topic, data=data, sender_hmac=rng.randbytes(32), originator_ns=now
            )
        elif kind == "commit":
            item = commit_message(0, sequence, rng.choice(group_topics))
        elif kind == "welcome":
            item = welcome_message(node, sequence, rng.choice(welcome_topics), originator_ns=now)
        elif kind == "identity_update":
            item = identity_update(node, sequence)
        else:
            item = key_package(node, sequence)
        tally[kind] += 1
        items.append(item)
    responses = []
    start = 0
    while start < len(items):
        size = rng.randint(min_batch, max_batch)
        batch = items[start : start + size]
        start += size
        responses.append(
            api.SubscribeEnvelopesResponse(envelopes=[i.envelope for i in batch]).SerializeToString()
        )
    pushable = tally["group_message"] + tally["commit"] + tally["welcome"]
    return Corpus(responses, count, pushable, tally, sum(map(len, responses)))


def write_corpus(corpus: Corpus, path: Path) -> None:
    with path.open("wb") as out:
        for response in corpus.responses:
            out.write(struct.pack(">I", len(response)))
            out.write(response)


def read_corpus(path: Path) -> list[bytes]:
    data = path.read_bytes()
    responses, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from(">I", data, offset)
        responses.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return responses


# --- where the listener runs -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def sqlite_url() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="xmtp-push-bench-") as folder:
        url = f"sqlite+aiosqlite:///{Path(folder) / 'listener.db'}"
        await asyncio.to_thread(upgrade, Settings(database_url=url))
        yield url


def bench_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "redis_url": None,
        "xmtpd_address": "127.0.0.1:1",
        "xmtpd_tls": False,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Run:
    seconds: float  # wall clock
    cpu_seconds: float  # this thread's CPU time (the event loop's): the number a busy host does not skew
    parsing: float  # wall seconds spent parsing response bytes


async def ingest_run(runtime: Runtime, corpus: Corpus) -> Run:
    """One pass over the corpus through a fresh Listener."""
    assert runtime.queue is not None
    listener = Listener(runtime, runtime.queue)
    parse = api.SubscribeEnvelopesResponse.FromString
    parsing = 0.0
    clock = time.perf_counter
    started, cpu_started = clock(), time.thread_time()
    for raw in corpus.responses:
        before = clock()
        response = parse(raw)
        parsing += clock() - before
        await listener._ingest(response.envelopes, catch_up=False)
    elapsed, cpu = clock() - started, time.thread_time() - cpu_started
    await listener._save_marks(force=True)
    depth = await runtime.queue.depth(ENVELOPES)
    if depth != corpus.pushable:
        raise AssertionError(f"queued {depth} envelopes, expected {corpus.pushable}")
    return Run(elapsed, cpu, parsing)


async def bench_memory(corpus: Corpus, repeat: int, profile: str | None) -> list[Run]:
    results = []
    async with sqlite_url() as url:
        for run in range(repeat):
            async with open_runtime(bench_settings(url), in_process_queue=True) as runtime:
                if profile and run == repeat - 1:
                    import cProfile
                    import pstats

                    profiler = cProfile.Profile()
                    profiler.enable()
                    results.append(await ingest_run(runtime, corpus))
                    profiler.disable()
                    profiler.dump_stats(profile)
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
                else:
                    results.append(await ingest_run(runtime, corpus))
    return results


async def bench_redis(corpus: Corpus, repeat: int, db: int) -> list[Run]:
    url = f"{REDIS_URL}/{db}"
    client = Redis.from_url(url)
    foreign = [key async for key in client.scan_iter(count=1000) if not key.startswith(b"xmtp-push:")]
    others = [
        c for c in await client.client_list() if int(c.get("db", -1)) == db and c.get("cmd") != "client|list"
    ]
    if foreign or others:
        await client.aclose()
        raise SystemExit(
            f"Redis DB {db} holds {len(foreign)} foreign keys and {len(others)} other clients use it; "
            "pick another --redis-db"
        )
    results = []
    try:
        async with sqlite_url() as database:
            for _ in range(repeat):
                await client.flushdb()
                async with open_runtime(bench_settings(database, redis_url=url)) as runtime:
                    results.append(await ingest_run(runtime, corpus))
    finally:
        await client.flushdb()
        await client.aclose()
    return results


# --- end to end through a fake xmtpd in another process ---------------------------------------------------


def listener_count() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "xmtp_push_listener_envelopes":
            total += sum(s.value for s in metric.samples if s.name == "xmtp_push_listener_envelopes_total")
    return total


async def bench_e2e(corpus: Corpus, corpus_file: Path) -> tuple[float, float, int]:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.listener_decode", "--serve", str(corpus_file), stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 120)).decode()
        if not line.startswith("port "):
            raise RuntimeError(f"the fake xmtpd did not start: {line!r}")
        port = int(line.split()[1])
        async with sqlite_url() as url:
            settings = bench_settings(
                url, xmtpd_address=f"127.0.0.1:{port}", xmtpd_keepalive_timeout_seconds=60
            )
            async with open_runtime(settings, in_process_queue=True) as runtime:
                assert runtime.queue is not None
                base = listener_count()
                stop = asyncio.Event()
                task = asyncio.create_task(run_listener(runtime, stop))
                deadline = time.monotonic() + 300
                while listener_count() == base:
                    if task.done() or time.monotonic() > deadline:
                        raise RuntimeError("no envelope reached the listener")
                    await asyncio.sleep(0.002)
                started, cpu_started = time.perf_counter(), time.process_time()
                while listener_count() - base < corpus.envelopes:
                    if task.done() or time.monotonic() > deadline:
                        raise RuntimeError(f"the listener counted {listener_count() - base:.0f} envelopes")
                    await asyncio.sleep(0.02)
                while await runtime.queue.depth(ENVELOPES) < corpus.pushable:
                    if time.monotonic() > deadline:
                        raise RuntimeError("not every pushable envelope was queued")
                    await asyncio.sleep(0.002)
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                depth = await runtime.queue.depth(ENVELOPES)
                stop.set()
                await asyncio.wait_for(task, 10)
                return elapsed, cpu, depth
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)


async def serve(corpus_file: Path) -> None:
    """The fake node: the whole corpus on the first stream, right after its empty first response."""
    responses = [api.SubscribeEnvelopesResponse.FromString(raw) for raw in read_corpus(corpus_file)]
    async with FakeXmtpd(keepalive_seconds=5.0) as fake:
        print(f"port {fake.port}", flush=True)
        await fake.wait_for(lambda: fake.open_streams >= 1, 300, "the listener")
        stream = next(iter(fake._streams))
        for response in responses:
            stream.queue.put_nowait(response)
        await asyncio.Event().wait()  # until terminated


# --- report ---------------------------------------------------------------------------------------------------


def report(name: str, corpus: Corpus, runs: Sequence[Run]) -> float:
    best = min(runs, key=lambda r: r.seconds)
    rate = corpus.envelopes / best.seconds
    cpu_rate = corpus.envelopes / min(r.cpu_seconds for r in runs)
    each = ", ".join(f"{corpus.envelopes / r.seconds:,.0f}" for r in runs)
    verdict = "ok" if rate >= TARGET_PER_SECOND else "BELOW TARGET"
    print(
        f"{name:>7}: {rate:10,.0f} envelopes/s wall, best of {len(runs)} ({each}); "
        f"{cpu_rate:,.0f}/s per CPU-second of the loop; {best.seconds:.2f} s, of which parsing responses "
        f"{best.parsing:.2f} s; {best.seconds / corpus.envelopes * 1e6:.1f} us/envelope  [{verdict}]"
    )
    return rate


async def main(args: argparse.Namespace) -> int:
    print(environment_line())
    started = time.perf_counter()
    corpus = build_corpus(args.envelopes, args.min_batch, args.max_batch, args.seed)
    mix = ", ".join(f"{kind} {n:,}" for kind, n in sorted(corpus.kinds.items()))
    print(
        f"corpus: {corpus.envelopes:,} envelopes ({mix}; {corpus.pushable:,} pushable) in "
        f"{len(corpus.responses):,} responses of {args.min_batch}-{args.max_batch}, "
        f"{corpus.wire_bytes / 1e6:.1f} MB on the wire; built in {time.perf_counter() - started:.1f} s"
    )
    rates = {"memory": report("memory", corpus, await bench_memory(corpus, args.repeat, args.profile))}
    if not args.no_redis:
        rates["redis"] = report("redis", corpus, await bench_redis(corpus, args.repeat, args.redis_db))
    if not args.no_e2e:
        with tempfile.TemporaryDirectory(prefix="xmtp-push-bench-") as folder:
            corpus_file = Path(folder) / "corpus.bin"
            write_corpus(corpus, corpus_file)
            elapsed, cpu, depth = await bench_e2e(corpus, corpus_file)
        rates["e2e"] = corpus.envelopes / elapsed
        verdict = "ok" if rates["e2e"] >= TARGET_PER_SECOND else "BELOW TARGET"
        print(
            f"    e2e: {rates['e2e']:10,.0f} envelopes/s wall over a real gRPC stream from a fake xmtpd in "
            f"another process; {corpus.envelopes / cpu:,.0f}/s per CPU-second of this process (gRPC "
            f"threads included); {elapsed:.2f} s, {depth:,} queued  [{verdict}]"
        )
    summary = ", ".join(f"{name} {rate:,.0f}/s" for name, rate in rates.items())
    print(f"summary: target {TARGET_PER_SECOND:,}/s on one core: {summary}")
    record(args.json, corpus, rates)
    return 0 if all(rate >= TARGET_PER_SECOND for rate in rates.values()) else 1


def record(path: str | None, corpus: Corpus, rates: dict[str, float]) -> None:
    results = Results("listener_decode", "listener decode + dedupe + enqueue, one core")
    results.add(
        "corpus", f"{corpus.envelopes:,} envelopes ({corpus.pushable:,} pushable)", value=corpus.envelopes
    )
    for name, rate in rates.items():
        results.add(
            f"{name}: envelopes/s",
            f"{rate:,.0f}",
            f">= {TARGET_PER_SECOND:,}/s",
            meets(rate >= TARGET_PER_SECOND),
            value=rate,
            unit="envelopes/s",
            key=f"{name}_per_s",
        )
    results.write(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.listener_decode", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--envelopes", type=int, default=200_000)
    parser.add_argument("--min-batch", type=int, default=50)
    parser.add_argument("--max-batch", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--redis-db", type=int, default=14, help="dedicated Redis DB for the RedisQueue run (FLUSHDB!)"
    )
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--no-e2e", action="store_true")
    parser.add_argument(
        "--profile", metavar="FILE", help="cProfile the last memory run into FILE and print it"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the measured rates as JSON to PATH")
    parser.add_argument("--serve", metavar="CORPUS", help=argparse.SUPPRESS)  # the fake node's process
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(Path(arguments.serve)))
        sys.exit(0)
    sys.exit(asyncio.run(main(arguments)))
