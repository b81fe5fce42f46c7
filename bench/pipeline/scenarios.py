"""The scenarios, over made-up HTTP recipients (--subscribers, round-robin over --topics topics).

- throughput: first a bare loop, the fastest plain client (aiohttp, one session, 256 posts in flight,
  signing as the backend does), posts the very same hints to the receiver: the ceiling. Then ours: the
  recipients registered over gRPC, --envelopes ingested, 4 requests of 100 in flight: ours/bare rates.
- latency, soak: the same, open loop at --rate hints/s for --duration s; the backend's RSS every 10 s.
- fanout: one envelope to a topic of --subscribers (bulk-inserted): time until every delivery job is on
  its stream (XINFO STREAM entries-added, polled every 2 ms), and until every one is received.
Latency: arrival at the receiver minus the send of the ingest request, both CLOCK_MONOTONIC."""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import hmac
import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any

import aiohttp
import grpc
from redis.asyncio import RedisCluster
from standardwebhooks.webhooks import Webhook

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.queue.base import partition_of
from app.queue.redis_calls import stream_key
from app.queue.redis_link import RedisLink
from bench import _support as support
from bench._support import Results, load_average, rss_mb, verdict
from bench.pipeline import CpuWindow, IngestLog, Ingestor, ReceiverClient, running_backend, running_receiver

RATIO_TARGET, FANOUT_TARGET_S, LATENCY_P99_TARGET_MS, RSS_TARGET_MB = 0.70, 2.0, 100.0, 200.0
BATCH, INGEST_CONCURRENCY, TICK = 100, 4, 0.01  # flat out: envelopes a request, in flight; open loop: s apart
BARE_CONCURRENCY, REGISTER_CONCURRENCY, FANOUT_WARM_UP, RSS_EVERY = 256, 32, 200, 10.0
# Receipts: waited for until none came for STALL_SECONDS; signatures: standardwebhooks' tolerance.
STALL_SECONDS, TOLERANCE_SECONDS = 20.0, 300


@dataclass(frozen=True, slots=True)
class Recipient:
    id: bytes
    secret: bytes
    key: bytes
    topic: bytes


def make_recipients(count: int, topics: Sequence[bytes]) -> list[Recipient]:
    token = secrets.token_bytes
    return [Recipient(token(32), token(32), token(32), topics[i % len(topics)]) for i in range(count)]


def deliveries(recipients: Sequence[Recipient], envelopes: Sequence[tuple[bytes, int]]) -> list[Any]:
    by_topic = collections.defaultdict[bytes, list[Recipient]](list)
    for recipient in recipients:
        by_topic[recipient.topic].append(recipient)
    return [(r, sequence_id) for topic, sequence_id in envelopes for r in by_topic[topic]]


@dataclass
class Stage:
    args: argparse.Namespace
    database_url: str
    redis: Any
    receiver_pid: int
    receiver: ReceiverClient
    hook: str


@contextlib.asynccontextmanager
async def staged(args: argparse.Namespace) -> AsyncIterator[Stage]:
    async with (
        support.bench_database() as database_url,
        running_receiver() as (proc, port),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
    ):
        redis, receiver, link = None, ReceiverClient(session, port), RedisLink(args.redis_url)
        if args.mode == "redis":  # the product's client, emptied: a single Redis's DB, or every primary
            redis = await link.client()
            await (redis.flushall(target_nodes=RedisCluster.PRIMARIES) if link.cluster else redis.flushdb())
            print(f"redis: {args.redis_url}, {'a cluster' if link.cluster else 'single'}, emptied")
        try:
            yield Stage(args, database_url, redis, proc.pid, receiver, receiver.base + "/hook")
        finally:
            if redis is not None:
                await redis.aclose()


def verified(keys: dict[bytes, bytes], headers: dict[str, str], body: str, arrived: float) -> bool:
    """The standardwebhooks library's check of a sampled hook, as at its arrival (a long run's early samples
    are past its tolerance by now): the timestamp within it, and one signature the library's own."""
    try:
        webhook = Webhook(keys[bytes.fromhex(json.loads(body)["recipient_id"])])
        stamp = int(headers["webhook-timestamp"])
        signature = webhook.sign(headers["webhook-id"], datetime.fromtimestamp(stamp, tz=UTC), body)
        return abs(arrived - stamp) <= TOLERANCE_SECONDS and signature in headers["webhook-signature"].split()
    except (KeyError, ValueError):
        return False


class Receipts:
    """The receiver's records against the expected (recipient id, sequence id) deliveries."""

    def __init__(self, dump: dict[str, Any], expected: set[Any], log: IngestLog, keys: Any) -> None:
        arrivals = collections.defaultdict[tuple[bytes, int], list[int]](list)  # by (recipient, sequence id)
        for recipient_hex, sequence_id, arrival in dump["records"]:
            arrivals[bytes.fromhex(recipient_hex), sequence_id].append(arrival)
        seen = {key: min(times) for key, times in arrivals.items() if key in expected}  # first arrivals
        self.duplicates = sum(len(arrivals[key]) - 1 for key in seen)
        self.unexpected = sum(len(times) for key, times in arrivals.items() if key not in expected)
        self.expected, self.unique, sent = len(expected), len(seen), log.sent_ns
        self.seconds = sorted((at - log.first_sent) / 1e9 for at in seen.values())  # after the first request
        self.latencies_ms = sorted((at - sent[s]) / 1e6 for (_, s), at in seen.items() if s in sent)
        self.samples, self.failed = len(dump["samples"]), sum(not verified(keys, *s) for s in dump["samples"])
        latency = ", ".join(f"p{p} {self.ms(p):.1f}" for p in (50, 90, 99, 100))
        print(f"ingest->receipt latency, ms: {latency} (p100: max); ingest errors {dict(log.errors)}")

    def ms(self, pct: float) -> float:
        return support.percentile(self.latencies_ms, pct)

    def add_rows(self, summary: Results) -> None:
        received, signed = f"{self.expected} / {self.unique}", f"{self.samples - self.failed}/{self.samples}"
        summary.add("deliveries expected / received", received, "all", verdict(self.unique == self.expected))
        summary.add("duplicates / unexpected", f"{self.duplicates} / {self.unexpected}")
        summary.add("signature samples ok", signed, "all", verdict(self.failed == 0))


def signed_post(recipient: Recipient, sequence_id: int) -> tuple[bytes, dict[str, str]]:
    """A hint's body and Standard Webhooks headers, signed as the backend signs: one `hmac.digest`."""
    topic = base64.b64encode(recipient.topic).decode()
    body = f'{{"topic":"{topic}","sequence_id":"{sequence_id}","recipient_id":"{recipient.id.hex()}"}}'
    message_id, now = f"bare_{sequence_id}_{recipient.id[:8].hex()}", str(int(time.time()))
    mac = hmac.digest(recipient.key, f"{message_id}.{now}.{body}".encode(), "sha256")
    signature = "v1," + base64.b64encode(mac).decode()
    headers = {"webhook-id": message_id, "webhook-timestamp": now, "webhook-signature": signature}
    return body.encode(), {"content-type": "application/json", **headers}


def check_signing(recipient: Recipient, sequence_id: int) -> None:
    """Stop the run unless the bare loop's signature is byte for byte the standardwebhooks library's."""
    body, headers = signed_post(recipient, sequence_id)
    stamp = datetime.fromtimestamp(int(headers["webhook-timestamp"]), tz=UTC)
    library = Webhook(recipient.key).sign(headers["webhook-id"], stamp, body.decode())
    if library != headers["webhook-signature"]:
        raise SystemExit("bare loop: its signature differs from the standardwebhooks library's")


async def measure_bare(stage: Stage, plan: list[tuple[Recipient, int]]) -> tuple[float, float]:
    """The same deliveries posted by the fastest plain client, with the backend's collector settings, on one
    session, BARE_CONCURRENCY in flight: (posts/s, CPU us per post)."""
    check_signing(*plan[0])
    url, work, ok, timeout = stage.hook, iter(plan), 0, aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=max(BARE_CONCURRENCY, 512), limit_per_host=0)
    http = aiohttp.ClientSession(connector=connector, timeout=timeout, skip_auto_headers=["User-Agent"])

    async def one() -> None:
        nonlocal ok
        for recipient, sequence_id in work:
            body, headers = signed_post(recipient, sequence_id)
            try:
                async with http.post(url, data=body, headers=headers, allow_redirects=False) as response:
                    await response.read()
                    ok += 200 <= response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                continue  # counted as not ok

    with support.service_collector() as collector:
        print(f"\n== bare loop: aiohttp, {BARE_CONCURRENCY} in flight; {collector} ==")
        cpu = CpuWindow({"receiver": stage.receiver_pid})
        async with http:
            started = time.monotonic()
            await asyncio.gather(*(one() for _ in range(BARE_CONCURRENCY)))
            elapsed = time.monotonic() - started
        cpu.stop()
    rate, us = ok / elapsed, cpu.seconds["bench"] / max(1, ok) * 1e6
    print(f"bare loop: {ok} of {len(plan)} posts ok in {elapsed:.2f} s = {rate:,.0f}/s, {us:.0f} us CPU each")
    print(cpu.describe())
    await stage.receiver.reset()
    return rate, us


async def register_over_grpc(stage: Stage, port: int, recipients: Sequence[Recipient]) -> None:
    """Register + UpdateSubscriptions of each recipient, REGISTER_CONCURRENCY at a time."""
    work = iter(recipients)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]

        async def one() -> None:
            for r in work:
                ids: dict[str, Any] = {"recipient_id": r.id, "recipient_secret": r.secret}
                http = pb.HttpDelivery(url=stage.hook, signing_key=r.key)
                await stub.Register(pb.RegisterRequest(**ids, http=http), timeout=30)
                adds = [pb.Subscription(topic=r.topic)]
                await stub.UpdateSubscriptions(pb.UpdateSubscriptionsRequest(**ids, adds=adds), timeout=30)

        await asyncio.gather(*(one() for _ in range(REGISTER_CONCURRENCY)))


async def copy_recipients(stage: Stage, recipients: Sequence[Recipient]) -> None:
    now, http = time.time_ns(), 3  # the HTTP channel
    rows = [(r.id, sha256(r.secret).digest(), http, stage.hook, r.key, 1, now, now) for r in recipients]
    subscriptions = [(r.topic, r.id, now - 10**10, None, None, False) for r in recipients]
    await support.copy_tables(
        stage.database_url,
        [
            ("recipients", support.RECIPIENT_COLUMNS, rows),
            ("subscriptions", support.SUBSCRIPTION_COLUMNS, subscriptions),
        ],
    )


async def entries_added(client: Any, key: str) -> int:
    """XINFO STREAM's entries-added (Redis 7.0+): counting XADDs, it ignores workers deleting entries."""
    try:
        info = await client.xinfo_stream(key)
    except Exception:  # the stream does not exist yet
        return 0
    return int(info.get("entries-added", info.get(b"entries-added")))


async def queued_at(client: Any, key: str, target: int) -> int:
    """Polls entries-added every 2 ms until `target`: monotonic ns then, 0 if not within a stall + 60 s."""
    deadline = time.monotonic() + STALL_SECONDS + 60
    while await entries_added(client, key) < target:
        if time.monotonic() > deadline:
            return 0
        await asyncio.sleep(0.002)
    return time.monotonic_ns()


async def sample_rss(pids: dict[str, int], rss: dict[str, list[float]]) -> None:
    while True:
        for name, pid in pids.items():
            rss[name].append(rss_mb(pid))
        await asyncio.sleep(RSS_EVERY)


async def measure(stage: Stage, recipients: list[Recipient], warm: list[bytes], envelopes: list[Any]) -> Any:
    """Register (fanout: in the database already), warm up on the `warm` topics, ingest, wait for every
    delivery: (receipts, ingest log, CPU, RSS samples, monotonic ns every job was queued (fanout) or 0)."""
    args, expected = stage.args, {(r.id, s) for r, s in deliveries(recipients, envelopes)}
    async with running_backend(args, stage.database_url, args.redis_url if stage.redis else None) as backend:
        if args.scenario != "fanout":
            await register_over_grpc(stage, backend.grpc_port, recipients)
        ingest = Ingestor(stage.receiver.session, backend.http_port)
        await ingest.closed_loop([(topic, i + 1) for i, topic in enumerate(warm)], len(warm), 1)
        count, _ = await stage.receiver.wait_for(len(deliveries(recipients, [(t, 0) for t in warm])), 10)
        print(f"warm-up: {len(warm)} envelope(s), {count} deliveries, not counted")
        await stage.receiver.reset()
        pids, watch = {p.name: p.pid for p in backend.procs}, None
        rss: dict[str, list[float]] = {name: [] for name in pids}
        sampler = asyncio.create_task(sample_rss(pids, rss))
        if args.scenario == "fanout" and stage.redis is not None:
            key = stream_key("deliveries.http", partition_of(envelopes[0][0], args.partitions))
            target = len(expected) + await entries_added(stage.redis, key)
            watch = asyncio.create_task(queued_at(stage.redis, key, target))
        cpu = CpuWindow(pids | {"receiver": stage.receiver_pid})
        if args.rate:
            log = await ingest.open_loop(envelopes, args.rate / (args.subscribers / args.topics), TICK)
        else:
            log = await ingest.closed_loop(envelopes, BATCH, INGEST_CONCURRENCY)
        await stage.receiver.wait_for(len(expected), STALL_SECONDS)
        cpu.stop()
        sampler.cancel()
        for name, pid in pids.items():
            rss[name].append(rss_mb(pid))
        dump = await stage.receiver.dump()
    print(cpu.describe())
    receipts = Receipts(dump, expected, log, {r.id: r.key for r in recipients})
    return receipts, log, cpu, rss, await watch if watch else 0


def spread_load(args: argparse.Namespace, count: int) -> tuple[list[bytes], list[Recipient], list[Any]]:
    topics = [b"\x00" + secrets.token_bytes(16) for _ in range(args.topics)]
    envelopes = [(topics[j % len(topics)], 1_000_000 + j) for j in range(count)]
    print(f"load: {count} envelopes to {args.topics} topics x {args.subscribers / args.topics:g} recipients")
    return topics, make_recipients(args.subscribers, topics), envelopes


async def throughput(args: argparse.Namespace, summary: Results) -> None:
    topics, recipients, envelopes = spread_load(args, args.envelopes)
    async with staged(args) as stage:
        bare_rate, bare_us = await measure_bare(stage, deliveries(recipients, envelopes))
        print("\n== ours: ingest -> fan-out -> delivery -> receiver ==")
        receipts, _, cpu, _, _ = await measure(stage, recipients, topics[:20], envelopes)
    seconds, n = receipts.seconds, receipts.unique
    rate = n / seconds[-1] if n else 0.0  # first ingest request -> last receipt
    backend = sum(v for name, v in cpu.seconds.items() if name.startswith(("worker", "dev", "api")))
    us, ratio = backend / max(1, n) * 1e6, rate / bare_rate
    ratio_row = (f"{ratio * 100:.0f} %", f">= {RATIO_TARGET * 100:.0f} %", verdict(ratio >= RATIO_TARGET))
    receipts.add_rows(summary)
    summary.add("ours deliveries/s, end to end", f"{rate:,.0f}")
    summary.add(f"bare loop posts/s ({BARE_CONCURRENCY} in flight)", f"{bare_rate:,.0f}")
    summary.add("ratio ours/bare (end to end)", *ratio_row)
    summary.add("CPU us per delivery: ours (api+workers) / bare", f"{us:.0f} / {bare_us:.0f}")
    latency = f"{receipts.ms(50):.1f} / {receipts.ms(99):.1f} ms"
    summary.add("ingest->receipt p50 / p99", latency, "" if args.rate else "(backlog drain)")


async def rate(args: argparse.Namespace, summary: Results) -> None:
    per_envelope = args.subscribers / args.topics  # hints
    topics, recipients, envelopes = spread_load(args, int(args.rate / per_envelope * args.duration))
    async with staged(args) as stage:
        receipts, log, _, rss, _ = await measure(stage, recipients, topics[:20], envelopes)
    p99, target = receipts.ms(99), f"< {LATENCY_P99_TARGET_MS:g} ms"
    issued = (len(log.sent_ns) - 1) / ((log.last_sent - log.first_sent) / 1e9) * per_envelope
    summary.add("hints/s offered / issued", f"{args.rate:g} / {issued:,.0f}")
    receipts.add_rows(summary)
    summary.add("ingest->receipt p50", f"{receipts.ms(50):.1f} ms")
    summary.add("ingest->receipt p99", f"{p99:.1f} ms", target, verdict(p99 < LATENCY_P99_TARGET_MS))
    summary.add("ingest->receipt max", f"{receipts.ms(100):.1f} ms")
    for name, mb in rss.items():
        flat = (f"< {RSS_TARGET_MB:g} MB, flat", verdict(max(mb) < RSS_TARGET_MB)) if name != "api" else ()
        summary.add(f"RSS {name} min / max", f"{min(mb):.1f} / {max(mb):.1f} MB", *flat)
        if args.scenario == "soak" and name != "api":
            second_half = mb[len(mb) // 2 :]
            summary.add(f"RSS {name} 2nd-half growth", f"{max(second_half) - min(second_half):.1f} MB")


async def fanout(args: argparse.Namespace, summary: Results) -> None:
    topic, warm = (b"\x00" + secrets.token_bytes(16) for _ in range(2))
    recipients = make_recipients(args.subscribers, [topic]) + make_recipients(FANOUT_WARM_UP, [warm])
    print(f"load: one envelope to a topic of {args.subscribers:,}, after one to a topic of {FANOUT_WARM_UP}")
    async with staged(args) as stage:
        await copy_recipients(stage, recipients)
        receipts, log, _, _, queued_at = await measure(stage, recipients, [warm], [(topic, 2)])
    queued_s, target = (queued_at - log.first_sent) / 1e9, f"<= {FANOUT_TARGET_S:g} s"
    queued = (f"{queued_s:.3f} s", verdict(queued_s <= FANOUT_TARGET_S)) if queued_at else ("n/a", "")
    summary.add("subscribers", f"{args.subscribers:,}")
    summary.add("ingest -> all delivery jobs queued", queued[0], target, queued[1])
    seconds = receipts.seconds or [math.nan]  # after the ingest request
    summary.add("ingest -> first / all received", f"{seconds[0]:.3f} / {seconds[-1]:.3f} s")
    lost = f"{receipts.unique} / {receipts.expected - receipts.unique} / {receipts.duplicates}"
    whole = verdict(receipts.unique == receipts.expected)
    summary.add("received / missing / duplicates", lost, "no loss", whole)


SCENARIOS = {  # what runs each scenario, and its defaults
    "throughput": (throughput, {"subscribers": 1000, "topics": 10, "envelopes": 1000, "rate": 0.0}),
    "fanout": (fanout, {"subscribers": 100_000, "topics": 1, "rate": 0.0}),
    "latency": (rate, {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 30.0}),
    "soak": (rate, {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 600.0}),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser("python -m bench.pipeline", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--mode", choices=["memory", "redis"], default="redis")
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="throughput")
    for name in ("workers", "partitions", "envelopes", "subscribers", "topics", "rate", "duration"):
        parser.add_argument(f"--{name}", type=float if name in ("rate", "duration") else int)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="a Redis DB or cluster node")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a backend setting")
    args = parser.parse_args()
    for name, value in ({"workers": 1, "partitions": 64} | SCENARIOS[args.scenario][1]).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


async def main(args: argparse.Namespace) -> int:
    workers = f", {args.workers} worker(s)" if args.mode == "redis" else ""
    print(f"{support.environment_line()}\nload average {load_average()}; backend settings {args.env}")
    summary = Results(f"{args.scenario}, {args.mode} mode{workers}, {args.partitions} queue partition(s)")
    await SCENARIOS[args.scenario][0](args, summary)
    summary.print()
    return 0
