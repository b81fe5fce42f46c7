"""Benchmark: the xmtpd listener's decode + dedupe + enqueue on one core, >= 20,000 envelopes/s. A seeded
corpus of real envelopes in SubscribeEnvelopesResponse batches of 50-500, each parsed and given to a Listener:
best of 3 passes with the in-process queue (`memory`) and on Redis DB --redis-db (`redis`, flushed); `e2e`: a
fake xmtpd in another process streams it to `run_listener`, timed from the first batch queued to the last."""

import argparse
import asyncio
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from typing import Any, NamedTuple

from redis.asyncio import Redis

from app.core.config import Settings, load_settings
from app.core.migrations import upgrade
from app.proto.xmtp.xmtpv4.message_api.message_api_pb2 import SubscribeEnvelopesResponse as Response
from app.queue.base import ENVELOPES
from app.runtime import open_runtime
from bench._support import Results, environment_line, verdict
from fakes import fake_xmtpd as fake
from workers.listener import Listener, run_listener

TARGET, REPEAT, REDIS_URL = 20_000, 3, "redis://127.0.0.1:6379"
LISTENER = {"redis_url": None, "xmtpd_address": "127.0.0.1:1", "xmtpd_tls": False}
MIX = {"group_message": 83, "commit": 2, "welcome": 5, "identity_update": 5, "key_package": 5}  # percent


class Corpus(NamedTuple):
    responses: list[bytes]  # serialized, as on the wire
    envelopes: int
    pushable: int


def make_item(rng: random.Random, kind: str, node: int, seq: int, topics: Any, now: int) -> fake.Item:
    if kind == "group_message":
        topic, size = rng.choice(topics[0]), rng.randint(130, 150)
        data = fake.private_message(fake.APPLICATION, group_id=topic[1:], ciphertext_size=size)
        hmac = rng.randbytes(32)
        return fake.group_message(node, seq, topic, data=data, sender_hmac=hmac, originator_ns=now)
    if kind == "commit":  # from originator 0 (the chain), with a blockchain proof
        return fake.commit_message(0, seq, rng.choice(topics[0]))
    if kind == "welcome":
        return fake.welcome_message(node, seq, rng.choice(topics[1]), originator_ns=now)
    return fake.identity_update(node, seq) if kind == "identity_update" else fake.key_package(node, seq)


def build_corpus(count: int, rng: random.Random) -> Corpus:
    topics = [[fake.group_topic(rng.randbytes(16)) for _ in range(5_000)]]
    topics.append([fake.welcome_topic() for _ in range(2_000)])
    shares = [kind for kind, share in MIX.items() for _ in range(share)]
    sequences, kinds, items, now = Counter[int](), Counter[str](), [], time.time_ns()
    for _ in range(count):
        kinds[kind := rng.choice(shares)] += 1
        sequences[node := 0 if kind == "commit" else rng.choice((100, 200, 300))] += 1
        items.append(make_item(rng, kind, node, sequences[node], topics, now))
    responses, start = [], 0
    while start < count:
        batch, start = items[start : start + (size := rng.randint(50, 500))], start + size
        responses.append(Response(envelopes=[item.envelope for item in batch]).SerializeToString())
    return Corpus(responses, count, kinds["group_message"] + kinds["commit"] + kinds["welcome"])


async def settings(folder: str, mode: str, **values: Any) -> Settings:  # marks: a fresh SQLite file a mode
    made = load_settings(database_url=f"sqlite+aiosqlite:///{folder}/{mode}.db", **(LISTENER | values))
    await asyncio.to_thread(upgrade, made)
    return made


async def passes(corpus: Corpus, settings: Settings, redis: Redis | None = None) -> float:
    runs, n = [], corpus.envelopes  # (wall, CPU of the loop's thread: what a busy host skews less) a pass
    for _ in range(REPEAT):
        await redis.flushdb() if redis else None
        async with open_runtime(settings, in_process_queue=redis is None) as runtime:
            assert runtime.queue is not None
            listener = Listener(runtime, runtime.queue)
            started, cpu_started = time.perf_counter(), time.thread_time()
            for raw in corpus.responses:  # each response parsed, as the gRPC deserializer does
                await listener._ingest(Response.FromString(raw).envelopes, catch_up=False)
            runs.append((time.perf_counter() - started, time.thread_time() - cpu_started))
            if (depth := await runtime.queue.depth(ENVELOPES)) != corpus.pushable:
                raise AssertionError(f"queued {depth} envelopes, expected {corpus.pushable}")
    wall, cpu, mode = min(runs)[0], min(run[1] for run in runs), "redis" if redis else "memory"
    print(f"{mode}: {n / wall:,.0f} envelopes/s, best of {REPEAT}; {n / cpu:,.0f} per CPU-second of the loop")
    return n / wall


def serve(responses: list[bytes], port: Any) -> None:
    asyncio.run(fake_node([Response.FromString(raw) for raw in responses], port))


async def fake_node(responses: list[Response], port: Any) -> None:
    node = await fake.FakeXmtpd(keepalive_seconds=5.0).start()
    port.send(node.port)
    await node.wait_for(lambda: node.open_streams >= 1, 300, "the listener")
    for response in responses:  # the whole corpus on the first stream, after its empty first response
        next(iter(node._streams)).queue.put_nowait(response)
    await asyncio.Event().wait()  # until terminated


async def bench_e2e(corpus: Corpus, folder: str) -> float:
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this loop and its threads
    ports, sender = spawn.Pipe(duplex=False)
    (node := spawn.Process(target=serve, args=(corpus.responses, sender), daemon=True)).start()
    if not await asyncio.to_thread(ports.poll, 120):
        raise RuntimeError("the fake xmtpd did not start")
    listener = await settings(folder, "e2e", xmtpd_address=f"127.0.0.1:{ports.recv()}")
    async with open_runtime(listener, in_process_queue=True) as runtime, asyncio.timeout(300):
        assert runtime.queue is not None
        depth, task = runtime.queue.depth, asyncio.create_task(run_listener(runtime, stop := asyncio.Event()))
        while not await depth(ENVELOPES) and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        started, cpu_started = time.perf_counter(), time.process_time()
        while await depth(ENVELOPES) < corpus.pushable and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        elapsed, cpu, n = time.perf_counter() - started, time.process_time() - cpu_started, corpus.envelopes
        stop.set()
        await task  # raises what stopped the listener early
    node.terminate()
    print(f"e2e: {n / elapsed:,.0f} envelopes/s; {n / cpu:,.0f} per CPU-second of the process, gRPC's too")
    return n / elapsed


async def main(args: argparse.Namespace) -> int:
    print(environment_line())
    corpus = build_corpus(args.envelopes, random.Random(1))
    with tempfile.TemporaryDirectory(prefix="xmtp-push-bench-") as folder:
        rates = {"memory": await passes(corpus, await settings(folder, "memory"))}
        async with Redis.from_url(url := f"{REDIS_URL}/{args.redis_db}") as redis:
            if [key async for key in redis.scan_iter(count=1000) if not key.startswith(b"xmtp-push:")]:
                raise SystemExit(f"Redis DB {args.redis_db} holds others' keys; pick another --redis-db")
            rates["redis"] = await passes(corpus, await settings(folder, "redis", redis_url=url), redis)
            await redis.flushdb()
        rates["e2e"] = await bench_e2e(corpus, folder)
    results = Results(f"listener, one core: {corpus.envelopes:,} envelopes ({corpus.pushable:,} pushable)")
    for name, rate in rates.items():
        results.add(f"{name}: envelopes/s", f"{rate:,.0f}", f">= {TARGET:,}/s", verdict(rate >= TARGET))
    results.print()
    return 0 if all(rate >= TARGET for rate in rates.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.listener_decode", description=__doc__)
    parser.add_argument("--envelopes", type=int, default=200_000)
    parser.add_argument("--redis-db", type=int, default=14, help="a Redis DB of its own (flushed)")
    sys.exit(asyncio.run(main(parser.parse_args())))
