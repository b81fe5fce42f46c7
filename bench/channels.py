"""Benchmark (not a test): APNs or FCM hints through the whole pipeline, against a bare library loop.

    python -m bench.channels --channel {apns,fcm} --hints N [--recipients M] [--topics T]
                             [--mode {redis,memory}] [--concurrency C]

One run:
1. starts the local fake in a separate process: `python -m app.testing.fake_apns` (TLS + HTTP/2, h2) or
   `python -m app.testing.fake_fcm` (FCM HTTP v1 + OAuth token endpoint, plain HTTP/1.1); both answer 200
   to every `ok.*` token and keep only counters, (token, body) pairs and the time of the last request;
2. the *bare loop*, in this process: the same library the backend uses, driven directly, sends N
   notifications (the same body shape, M tokens) to that fake with C in flight: aioapns' `APNs` client
   (a pool of 4 connections like ours, its protocol class pointed at the fake) or firebase-admin's
   `messaging.send_each_async` (one message per call, C calls in flight, the service's URL pointed at
   the fake);
3. the backend: redis mode (default) runs `xmtp-push api` and one `xmtp-push worker` (Redis DB
   `--redis-db`, FLUSHDB first, and a fresh migrated PostgreSQL database); memory mode one `xmtp-push
   dev` (in-process queue, PostgreSQL). Only the benchmarked channel is configured, with the fake as
   its endpoint. M recipients of that channel register over gRPC, spread over T topics; envelopes go
   in over `POST /v1/envelopes` until N hints are due (N / (M / T) envelopes, round-robin over the
   topics), and the run waits until the fake has seen all N distinct (token, body) pairs.

Rates: hints / (time of the last request at the fake - time the first one was sent), both clocks
CLOCK_MONOTONIC. Prints both rates and pipeline/bare (target >= 70 %).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.testing import keys
from bench._proc import load_average
from bench._processes import Proc, start_process, stop_process
from bench._results import Results
from bench._results import verdict as meets
from bench._support import (
    DEFAULT_ADMIN_DSN,
    bench_database,
    environment_line,
    run_on_fastest_loop,
    service_collector,
)
from bench.pipeline import CpuWindow, Ingestor, running_backend

RATIO_TARGET = 0.70
BUNDLE_ID, KEY_ID, TEAM_ID = "org.example.bench", "BENCHKEY01", "BENCHTEAM1"
PROJECT_ID = "bench-project"
_APNS_READY = re.compile(r"fake apns listening on (\d+) control (\d+) ca (\S+)")
_FCM_READY = re.compile(r"fake fcm listening on (\d+)")


# --------------------------------------------------------------------------- the fake, in its own process


@dataclass
class Fake:
    proc: Proc
    send_port: int  # where notifications go
    control: str  # base URL of /stats and /reset
    ca_file: str | None = None

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(self.control + "/stats") as response:
            result: dict[str, Any] = await response.json()
            return result

    async def reset(self, session: aiohttp.ClientSession) -> None:
        async with session.post(self.control + "/reset") as response:
            response.raise_for_status()

    async def wait_for(
        self, session: aiohttp.ClientSession, unique: int, stall_seconds: float
    ) -> dict[str, Any]:
        """Poll until `unique` distinct notifications arrived, or no progress for stall_seconds."""
        last, last_change = -1, time.monotonic()
        while True:
            stats = await self.stats(session)
            if stats["unique"] >= unique:
                return stats
            if stats["unique"] != last:
                last, last_change = stats["unique"], time.monotonic()
            elif time.monotonic() - last_change > stall_seconds:
                return stats
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_fake(channel: str) -> AsyncIterator[Fake]:
    folder = tempfile.mkdtemp(prefix="bench-fake-")
    if channel == "apns":
        command = [sys.executable, "-m", "app.testing.fake_apns", "--tls-dir", folder]
        proc = await start_process("fake-apns", command, dict(os.environ), _APNS_READY)
        fake = Fake(
            proc, int(proc.match.group(1)), f"http://127.0.0.1:{proc.match.group(2)}", proc.match.group(3)
        )
        described = f"TLS + HTTP/2 (h2) on {fake.send_port}"
    else:
        command = [sys.executable, "-m", "app.testing.fake_fcm"]
        proc = await start_process("fake-fcm", command, dict(os.environ), _FCM_READY)
        port = int(proc.match.group(1))
        fake = Fake(proc, port, f"http://127.0.0.1:{port}")
        described = f"HTTP/1.1 (aiohttp) on {port}, OAuth token endpoint /token"
    print(f"fake {channel}: pid {proc.pid}, {described}")
    try:
        yield fake
    finally:
        await stop_process(proc)


# --------------------------------------------------------------------------- what is sent


def topic_b64(topic: bytes) -> str:
    return base64.b64encode(topic).decode()


def service_account(fake: Fake) -> str:
    return keys.service_account(token_uri=f"http://127.0.0.1:{fake.send_port}/token", project_id=PROJECT_ID)


def backend_settings(channel: str, fake: Fake) -> list[str]:
    if channel == "apns":
        assert fake.ca_file is not None
        return [
            f"APNS_KEY={keys.apns_key_pem()}",
            f"APNS_KEY_ID={KEY_ID}",
            f"APNS_TEAM_ID={TEAM_ID}",
            f"APNS_BUNDLE_ID={BUNDLE_ID}",
            f"APNS_ENDPOINT=https://127.0.0.1:{fake.send_port}",
            f"APNS_CA_FILE={fake.ca_file}",
        ]
    return [f"FCM_SERVICE_ACCOUNT={service_account(fake)}", f"FCM_ENDPOINT=http://127.0.0.1:{fake.send_port}"]


# --------------------------------------------------------------------------- the bare loop


Sender = Callable[[str, bytes, int], Awaitable[bool]]


def bare_apns_client(fake: Fake) -> Any:
    """aioapns's own `APNs` client (4 connections, one attempt each), pointed at the fake."""
    from aioapns import APNs
    from aioapns.connection import APNsTLSClientProtocol

    client = APNs(
        key=keys.apns_key_pem(),
        key_id=KEY_ID,
        team_id=TEAM_ID,
        topic=BUNDLE_ID,
        max_connections=4,
        max_connection_attempts=1,
        ssl_context=ssl.create_default_context(cafile=fake.ca_file),
    )
    # aioapns' host is a class attribute of its protocol: point a subclass at the fake.
    client.pool.protocol_class = type(
        "FakeApnsProtocol",
        (APNsTLSClientProtocol,),
        {"APNS_SERVER": "127.0.0.1", "APNS_PORT": fake.send_port},
    )
    return client


@contextlib.asynccontextmanager
async def bare_apns(fake: Fake) -> AsyncIterator[Sender]:
    from aioapns.common import NotificationRequest, PushType

    client = bare_apns_client(fake)

    async def send(token: str, topic: bytes, sequence_id: int) -> bool:
        encoded = topic_b64(topic)
        request = NotificationRequest(
            device_token=token,
            message={"aps": {"content-available": 1}, "topic": encoded, "sequence_id": str(sequence_id)},
            priority=5,
            push_type=PushType.BACKGROUND,
            collapse_key=encoded,
        )
        result = await asyncio.wait_for(client.send_notification(request), 10)
        return bool(result.is_successful)

    try:
        yield send
    finally:
        client.pool.close()


@contextlib.asynccontextmanager
async def bare_fcm(fake: Fake) -> AsyncIterator[Sender]:
    import firebase_admin
    from firebase_admin import credentials, messaging

    account = json.loads(service_account(fake))
    app = firebase_admin.initialize_app(
        credentials.Certificate(account), {"projectId": PROJECT_ID, "httpTimeout": 10}, name="bench-bare"
    )
    # The FCM URL is a constant of the library: point the app's messaging service at the fake.
    service = messaging._get_messaging_service(app)
    service._fcm_url = f"http://127.0.0.1:{fake.send_port}/v1/projects/{PROJECT_ID}/messages:send"

    async def send(token: str, topic: bytes, sequence_id: int) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Message.token
            message = messaging.Message(
                token=token,
                data={"topic": topic_b64(topic), "sequence_id": str(sequence_id)},
                android=messaging.AndroidConfig(priority="high"),
                apns=messaging.APNSConfig(
                    headers={"apns-priority": "5", "apns-push-type": "background"},
                    payload=messaging.APNSPayload(aps=messaging.Aps(content_available=True)),
                ),
            )
        batch = await messaging.send_each_async([message], dry_run=False, app=app)
        return bool(batch.success_count == 1)

    try:
        yield send
    finally:
        # firebase_admin.delete_app closes the client with asyncio.run(), which fails on a running loop.
        await service._async_client.aclose()


async def drive(
    send: Sender, work: Sequence[tuple[str, bytes, int]], concurrency: int, attempts: int = 3
) -> tuple[int, int, int]:
    """Send every (token, topic, sequence_id) with `concurrency` in flight, trying a failed one again
    up to `attempts` times in all (as the pipeline does); (delivered, retried, given up)."""
    items = iter(work)
    ok = retried = failed = 0

    async def one() -> None:
        nonlocal ok, retried, failed
        for token, topic, sequence_id in items:
            for attempt in range(attempts):
                try:
                    delivered = await send(token, topic, sequence_id)
                except Exception:
                    delivered = False
                if delivered:
                    ok += 1
                    break
                retried += attempt + 1 < attempts
            else:
                failed += 1

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return ok, retried, failed


async def run_bare(
    args: argparse.Namespace,
    fake: Fake,
    session: aiohttp.ClientSession,
    plan: Sequence[tuple[str, bytes, int]],
    results: Results | None = None,
) -> float:
    factory = bare_apns if args.channel == "apns" else bare_fcm
    with service_collector() as collector:
        print(f"bare loop collector: {collector}")
        return await _timed_bare(args, fake, session, plan, results, factory)


async def _timed_bare(
    args: argparse.Namespace,
    fake: Fake,
    session: aiohttp.ClientSession,
    plan: Sequence[tuple[str, bytes, int]],
    results: Results | None,
    factory: Callable[[Fake], AbstractAsyncContextManager[Sender]],
) -> float:
    async with factory(fake) as send:
        warm = [(f"ok.warm{i}", b"\x00" * 17, i) for i in range(min(50, args.concurrency))]
        await drive(send, warm, args.concurrency)  # connections and the OAuth token
        await fake.reset(session)
        cpu = CpuWindow({"fake": fake.proc.pid})
        started = time.monotonic_ns()
        ok, retried, failed = await drive(send, plan, args.concurrency)
        stats = await fake.wait_for(session, len(plan), args.stall)
        cpu.stop()
    elapsed = (stats["last_ns"] - started) / 1e9
    rate = stats["unique"] / elapsed if elapsed > 0 else 0.0
    library = "aioapns 4.0 APNs client" if args.channel == "apns" else "firebase-admin send_each_async"
    print(
        f"bare loop ({library}, {args.concurrency} in flight): {stats['unique']:,} of {len(plan):,} in "
        f"{elapsed:.2f} s = {rate:,.0f} hints/s (delivered {ok:,}, retried {retried:,}, given up {failed:,})"
    )
    print("  " + cpu.describe())
    print("  " + per_hint(cpu, stats["unique"], ["bench", "fake"]))
    if results is not None:
        record_run(results, f"bare loop ({library})", stats["unique"], len(plan), cpu, "bench")
    return rate


def per_hint(cpu: CpuWindow, hints: int, names: Sequence[str]) -> str:
    """CPU time per hint of the named processes: steadier than rates when other load shares the host."""
    if not hints:
        return "cpu per hint: n/a"
    parts = [
        f"{name} {cpu.result[name] * cpu.wall / hints * 1e6:.0f} us" for name in names if name in cpu.result
    ]
    return "cpu per hint: " + ", ".join(parts)


# --------------------------------------------------------------------------- the pipeline


async def register(
    grpc_port: int, channel: str, tokens: Sequence[tuple[str, bytes]], concurrency: int
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as connection:
        stub = notification_pb2_grpc.NotificationServiceStub(connection)
        work = iter(tokens)

        async def one() -> None:
            for token, topic in work:
                rid, secret = secrets.token_bytes(32), secrets.token_bytes(32)
                delivery: dict[str, Any] = (
                    {"apns": pb.ApnsDelivery(token=token)}
                    if channel == "apns"
                    else {"fcm": pb.FcmDelivery(token=token)}
                )
                await stub.Register(
                    pb.RegisterRequest(recipient_id=rid, recipient_secret=secret, **delivery), timeout=30
                )
                await stub.UpdateSubscriptions(
                    pb.UpdateSubscriptionsRequest(
                        recipient_id=rid, recipient_secret=secret, adds=[pb.Subscription(topic=topic)]
                    ),
                    timeout=30,
                )

        await asyncio.gather(*(one() for _ in range(concurrency)))


async def run_pipeline(
    args: argparse.Namespace,
    fake: Fake,
    session: aiohttp.ClientSession,
    topics: Sequence[bytes],
    envelopes: Sequence[tuple[bytes, int]],
    expected: int,
    results: Results | None = None,
) -> float:
    backend_args = argparse.Namespace(
        mode=args.mode, workers=1, env=[*backend_settings(args.channel, fake), *args.env]
    )
    redis_url = None
    if args.mode == "redis":
        from redis.asyncio import Redis

        redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
        client = Redis.from_url(redis_url)
        await client.flushdb()
        await client.aclose()
        print(f"redis: {redis_url} (FLUSHDB done)")
    async with (
        bench_database(args.admin_dsn) as database_url,
        running_backend(backend_args, database_url, redis_url) as backend,
    ):
        per_topic = args.recipients // len(topics)
        tokens = [(f"ok.{i}", topics[i % len(topics)]) for i in range(per_topic * len(topics))]
        warm_topic = b"\x00" + secrets.token_bytes(16)
        started = time.monotonic()
        await register(backend.grpc_port, args.channel, [*tokens, ("ok.warm", warm_topic)], 32)
        print(
            f"registered {len(tokens) + 1:,} {args.channel} recipients over gRPC in {time.monotonic() - started:.1f} s"
        )
        ingest = Ingestor(session, backend.http_port)
        await ingest.closed_loop([(warm_topic, 1)], 1, 1)  # connections and the OAuth token
        await fake.wait_for(session, 1, args.stall)
        await fake.reset(session)

        names = {"api" if args.mode == "redis" else "dev": backend.api.pid, "fake": fake.proc.pid}
        for n, pid in enumerate(backend.worker_pids if args.mode == "redis" else []):
            names[f"worker-{n}"] = pid
        profiler = await start_profiler(args, backend.worker_pids[0])
        cpu = CpuWindow(names)
        log = await ingest.closed_loop(envelopes, args.batch, 2)
        stats = await fake.wait_for(session, expected, args.stall)
        cpu.stop()
        await stop_profiler(profiler, args)
    elapsed = (stats["last_ns"] - log.first_sent) / 1e9
    rate = stats["unique"] / elapsed if elapsed > 0 else 0.0
    errors = f", ingest errors {dict(log.errors)}" if log.errors else ""
    duplicates = stats["count"] - stats["unique"]
    print(
        f"pipeline ({args.mode} mode): {stats['unique']:,} of {expected:,} hints in {elapsed:.2f} s = "
        f"{rate:,.0f} hints/s ({len(envelopes):,} envelopes, {duplicates} duplicates{errors})"
    )
    print("  " + cpu.describe())
    print("  " + per_hint(cpu, stats["unique"], [n for n in names if n != "fake"] + ["fake"]))
    if results is not None:
        delivering = "worker-0" if args.mode == "redis" else "dev"
        record_run(results, f"pipeline ({args.mode} mode)", stats["unique"], expected, cpu, delivering)
        results.add("pipeline duplicates", str(duplicates), "0", meets(duplicates == 0), value=duplicates)
    return rate


def record_run(results: Results, label: str, unique: int, planned: int, cpu: CpuWindow, process: str) -> None:
    results.add(
        f"{label}: hints delivered / planned",
        f"{unique:,} / {planned:,}",
        "all",
        meets(unique >= planned),
        value=unique,
    )
    if unique and process in cpu.result:
        us = cpu.result[process] * cpu.wall / unique * 1e6
        results.add(f"{label}: CPU per hint, {process} process", f"{us:.0f} us", value=us, unit="us")


def record_rates(results: Results, bare: float, ours: float) -> None:
    if bare:
        results.add("bare loop hints/s", f"{bare:,.0f}", value=bare, unit="hints/s", key="bare_per_s")
    if ours:
        results.add("pipeline hints/s", f"{ours:,.0f}", value=ours, unit="hints/s", key="ours_per_s")
    if bare and ours:
        ratio = ours / bare
        results.add(
            "ratio pipeline/bare",
            f"{ratio * 100:.0f} %",
            f">= {RATIO_TARGET * 100:.0f} %",
            meets(ratio >= RATIO_TARGET),
            value=ratio * 100,
            unit="%",
            key="ratio",
        )


async def start_profiler(args: argparse.Namespace, pid: int) -> asyncio.subprocess.Process | None:
    """`--py-spy FILE`: sample the delivering process (the worker, or `dev`) while the hints flow."""
    if not args.py_spy:
        return None
    command = [
        shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy",  # the venv's first
        "record",
        "--pid",
        str(pid),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        args.py_spy,
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await asyncio.sleep(0.5)  # attached
    return process


async def stop_profiler(process: asyncio.subprocess.Process | None, args: argparse.Namespace) -> None:
    if process is None:
        return
    process.send_signal(signal.SIGINT)
    await process.wait()
    print(f"py-spy: raw stacks in {args.py_spy}; hottest frames (self, % of samples):")
    print(hot_spots(args.py_spy))


def hot_spots(path: str, top: int = 15) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as handle:
        for line in handle:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            total += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                inclusive[frame] += int(count)
    if not total:
        return "  (no samples)"
    lines = [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append("  inclusive, frames of app/ and workers/:")
    ours = [(f, n) for f, n in inclusive.most_common() if "(app/" in f or "(workers/" in f]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in ours[:top]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.channels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--channel", choices=["apns", "fcm"], required=True)
    parser.add_argument("--hints", type=int, default=20_000, help="hints to deliver (N)")
    parser.add_argument("--recipients", type=int, default=1000, help="recipients of the channel (M)")
    parser.add_argument("--topics", type=int, default=10, help="topics the recipients are spread over (T)")
    parser.add_argument("--mode", choices=["redis", "memory"], default="redis")
    parser.add_argument(
        "--concurrency", type=int, default=256, help="bare loop in flight (ours: 256 per channel)"
    )
    parser.add_argument("--batch", type=int, default=10, help="envelopes per ingest request")
    parser.add_argument("--stall", type=float, default=30.0, help="give up after this long without progress")
    parser.add_argument("--no-bare", action="store_true")
    parser.add_argument("--no-pipeline", action="store_true")
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    parser.add_argument("--redis-db", type=int, default=12, help="dedicated Redis DB, flushed first")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra backend setting"
    )
    parser.add_argument(
        "--py-spy", metavar="FILE", help="profile the worker during the pipeline run (py-spy)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the measured numbers as JSON to PATH")
    args = parser.parse_args(argv)
    if args.recipients < args.topics:
        parser.error("--recipients must be at least --topics")
    return args


async def amain(args: argparse.Namespace) -> int:
    print(environment_line())
    print(f"host load average at start: {load_average()}")
    topics = [b"\x00" + secrets.token_bytes(16) for _ in range(args.topics)]
    per_topic = args.recipients // args.topics
    count = -(-args.hints // per_topic)  # envelopes
    envelopes = [(topics[i % len(topics)], 1000 + i) for i in range(count)]
    expected = count * per_topic
    # The bare loop sends exactly what the pipeline will: each envelope to each of its topic's tokens.
    tokens_by_topic = {
        t: [f"ok.{i}" for i in range(per_topic * len(topics)) if i % len(topics) == n]
        for n, t in enumerate(topics)
    }
    plan = [(token, topic, seq) for topic, seq in envelopes for token in tokens_by_topic[topic]]
    print(
        f"channel {args.channel}: {expected:,} hints = {count:,} envelopes x {per_topic} recipients per topic "
        f"({per_topic * len(topics):,} recipients over {len(topics)} topics)"
    )
    if args.env:
        print(f"extra backend settings: {' '.join(args.env)}")
    bare = ours = 0.0
    results = Results("channels", f"{args.channel} hints through the pipeline vs a bare library loop")
    results.info["run"] = {"channel": args.channel, "mode": args.mode, "hints": expected}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session, running_fake(args.channel) as fake:
        if not args.no_bare:
            bare = await run_bare(args, fake, session, plan, results)
            await fake.reset(session)
        if not args.no_pipeline:
            ours = await run_pipeline(args, fake, session, topics, envelopes, expected, results)
    if bare and ours:
        ratio = ours / bare
        verdict = "PASS" if ratio >= RATIO_TARGET else "BELOW TARGET"
        print(
            f"RESULT {args.channel}: pipeline {ours:,.0f} hints/s, bare {bare:,.0f} hints/s, "
            f"ratio {ratio * 100:.0f} % (target >= {RATIO_TARGET * 100:.0f} %: {verdict})"
        )
    record_rates(results, bare, ours)
    results.write(args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_on_fastest_loop(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
