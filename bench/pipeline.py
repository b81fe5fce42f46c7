"""Benchmark (not a test): the delivery pipeline end to end, ingest -> fan-out -> webhook receipt.

    python -m bench.pipeline --mode {memory,redis} [--workers N] [--scenario S] ...

Scenarios (`--scenario`):
- `throughput` (default): M HTTP recipients (`--subscribers`) spread round-robin over T topics
  (`--topics`), registered and subscribed over real gRPC; N envelopes (`--envelopes`) ingested over
  `POST /v1/envelopes` in batches, round-robin over the topics, either as fast as possible
  (`--rate 0`, closed loop with `--ingest-concurrency` requests in flight) or open loop at `--rate`
  hints/s. In the same run, before the backend starts, a "bare loop" (aiohttp, one shared
  ClientSession/TCPConnector, `--bare-concurrency` posts in flight, standardwebhooks signing) posts
  the very same bodies to the same receiver: the ceiling for this machine. Prints ours/bare.
- `fanout`: one envelope to a topic with `--subscribers` (default 100,000) HTTP subscribers,
  bulk-inserted with COPY. Measures the time from the ingest request until every delivery job is
  on `xmtp-push:deliveries.http` (redis mode: the stream's `entries-added` counter from XINFO
  STREAM, polled every 2 ms: it counts XADDs, so it is not fooled by workers consuming and deleting
  entries meanwhile), and until the receiver has all of them.
- `latency`: open loop at `--rate` hints/s (default 1,000) for `--duration` s (default 30);
  p50/p99 ingest-to-receipt, overall and per window.
- `soak`: `latency` for longer (`--duration 600 --rate 1000`), sampling VmRSS of the backend
  processes every `--rss-every` s (default 10) and printing min/max.

Every run creates a fresh migrated PostgreSQL database (`--db sqlite` puts memory mode on a SQLite
file instead), uses Redis DB `--redis-db` (FLUSHDB first; redis mode only), starts the receiver
(`bench.receiver`) in its own process and the backend as subprocesses: memory mode one `xmtp-push
dev`, redis mode one `xmtp-push api` and `--workers` `xmtp-push worker` processes.

Ingest-to-receipt latency = arrival time at the receiver minus the moment the bench sent the
ingest request carrying that envelope (both CLOCK_MONOTONIC, system-wide on Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from bench._support import DEFAULT_ADMIN_DSN, asyncpg_dsn, bench_database, environment_line, percentile

INGEST_TOKEN = "bench-ingest-token-" + secrets.token_hex(8)
DELIVERY_STREAM = "xmtp-push:deliveries.http"
RATIO_TARGET = 0.70
FANOUT_TARGET_S = 2.0
LATENCY_P99_TARGET_MS = 100.0
RSS_TARGET_MB = 200.0
_SERVING = re.compile(r"serving HTTP on port (\d+) and gRPC on port (\d+)")
_WORKER_READY = re.compile(r"worker started")
_RECEIVER_READY = re.compile(r"receiver listening on (\d+)")
HTTP_CHANNEL = 3


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    tail: collections.deque[str]
    drainer: asyncio.Task[None]
    match: re.Match[str]

    @property
    def pid(self) -> int:
        return self.process.pid


def _script(name: str) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(script):
        return [script]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", "app.cli"]


async def start_process(
    name: str, command: list[str], env: dict[str, str], ready: re.Pattern[str], stream: str = "stderr"
) -> Proc:
    process = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    tail: collections.deque[str] = collections.deque(maxlen=200)
    found: asyncio.Future[re.Match[str]] = asyncio.get_running_loop().create_future()

    async def drain() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            matched = ready.search(line)
            if matched and not found.done():
                found.set_result(matched)
        if not found.done():
            found.set_exception(RuntimeError(f"{name} exited before it was ready"))

    drainer = asyncio.create_task(drain())
    try:
        matched = await asyncio.wait_for(found, timeout=60)
    except Exception:
        print(f"{name} output tail:\n" + "\n".join(tail), file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    return Proc(name, process, tail, drainer, matched)


async def stop_process(proc: Proc) -> int | None:
    if proc.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.process.wait(), timeout=30)
        except TimeoutError:
            proc.process.kill()
            await proc.process.wait()
    await asyncio.gather(proc.drainer, return_exceptions=True)
    errors = [line for line in proc.tail if " ERROR " in line or "Traceback" in line or "CRITICAL" in line]
    if errors:
        print(f"-- {proc.name} (pid {proc.pid}) logged errors; last lines:", file=sys.stderr)
        print("\n".join(list(proc.tail)[-40:]), file=sys.stderr)
    return proc.process.returncode


def backend_env(args: argparse.Namespace, database_url: str, redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_")}
    env.update(
        {
            "XMTP_PUSH_DATABASE_URL": database_url,
            "XMTP_PUSH_INGEST_TOKEN": INGEST_TOKEN,
            "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
            "XMTP_PUSH_HTTP_PORT": "0",
            "XMTP_PUSH_GRPC_HOST": "127.0.0.1",
            "XMTP_PUSH_GRPC_PORT": "0",
            "XMTP_PUSH_HTTP_ENABLED": "true",
            "XMTP_PUSH_HTTP_ALLOW_INSECURE": "true",
            "XMTP_PUSH_HTTP_ALLOW_PRIVATE_ADDRESSES": "true",
        }
    )
    if redis_url:
        env["XMTP_PUSH_REDIS_URL"] = redis_url
    for item in args.env:
        key, _, value = item.partition("=")
        env[key if key.startswith("XMTP_PUSH_") else "XMTP_PUSH_" + key] = value
    return env


@dataclass
class Backend:
    http_port: int
    grpc_port: int
    api: Proc
    workers: list[Proc]

    @property
    def procs(self) -> list[Proc]:
        return [self.api, *self.workers]

    @property
    def worker_pids(self) -> list[int]:
        # In memory mode the one `dev` process is also the worker.
        return [w.pid for w in self.workers] or [self.api.pid]


@contextlib.asynccontextmanager
async def running_backend(
    args: argparse.Namespace, database_url: str, redis_url: str | None
) -> AsyncIterator[Backend]:
    env = backend_env(args, database_url, redis_url)
    procs: list[Proc] = []
    try:
        if args.mode == "memory":
            api = await start_process("dev", [*_script("xmtp-push"), "dev"], env, _SERVING)
            procs.append(api)
            workers: list[Proc] = []
        else:
            api = await start_process("api", [*_script("xmtp-push"), "api"], env, _SERVING)
            procs.append(api)
            workers = []
            for n in range(args.workers):
                worker = await start_process(
                    f"worker-{n}", [*_script("xmtp-push"), "worker"], env, _WORKER_READY
                )
                procs.append(worker)
                workers.append(worker)
        backend = Backend(int(api.match.group(1)), int(api.match.group(2)), api, workers)
        described = ", ".join(f"{p.name} pid {p.pid}" for p in procs)
        print(f"backend: {args.mode} mode: {described}; HTTP {backend.http_port}, gRPC {backend.grpc_port}")
        yield backend
    finally:
        for proc in reversed(procs):
            code = await stop_process(proc)
            if code not in (0, None):
                print(f"backend: {proc.name} exited with {code}", file=sys.stderr)


@contextlib.asynccontextmanager
async def running_receiver(args: argparse.Namespace) -> AsyncIterator[tuple[Proc, int]]:
    command = [
        sys.executable,
        "-m",
        "bench.receiver",
        "--port",
        str(args.receiver_port),
        "--sample-every",
        str(args.sample_every),
    ]
    proc = await start_process("receiver", command, dict(os.environ), _RECEIVER_READY)
    port = int(proc.match.group(1))
    print(f"receiver: pid {proc.pid}, http://127.0.0.1:{port}/hook (raw asyncio + httptools + uvloop)")
    try:
        yield proc, port
    finally:
        await stop_process(proc)


def _load_json(path: str) -> Any:
    with open(path) as file:
        return json.load(file)


class ReceiverClient:
    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def count(self) -> int:
        async with self.session.get(self.base + "/stats") as response:
            return int((await response.json())["count"])

    async def reset(self) -> None:
        async with self.session.post(self.base + "/reset") as response:
            response.raise_for_status()

    async def dump(self) -> dict[str, Any]:
        handle, path = tempfile.mkstemp(prefix="bench-receiver-", suffix=".json")
        os.close(handle)
        try:
            async with self.session.post(
                self.base + "/dump", data=path.encode(), timeout=aiohttp.ClientTimeout(total=300)
            ) as response:
                response.raise_for_status()
            return await asyncio.to_thread(_load_json, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def wait_for(self, expected: int, stall_seconds: float, poll: float = 0.1) -> tuple[int, float]:
        """Poll until `expected` arrivals or no progress for stall_seconds; (count, monotonic when done)."""
        last, last_change = -1, time.monotonic()
        while True:
            count = await self.count()
            now = time.monotonic()
            if count >= expected:
                return count, now
            if count != last:
                last, last_change = count, now
            elif now - last_change > stall_seconds:
                return count, now
            await asyncio.sleep(poll)


# --------------------------------------------------------------------------- CPU and memory accounting


def process_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu() -> tuple[float, float]:
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return float(total - idle), float(total)


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except FileNotFoundError:
        pass
    return math.nan


class CpuWindow:
    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {**procs, "bench": os.getpid()}
        self.start_wall = time.monotonic()
        self.start = {name: process_cpu_seconds(pid) for name, pid in self.procs.items()}
        self.start_host = host_cpu()
        self.result: dict[str, float] = {}

    def stop(self) -> CpuWindow:
        wall = time.monotonic() - self.start_wall
        self.wall = wall
        self.seconds = {name: process_cpu_seconds(pid) - self.start[name] for name, pid in self.procs.items()}
        self.result = {name: used / wall for name, used in self.seconds.items()}
        busy, total = host_cpu()
        self.host_busy = (
            (busy - self.start_host[0]) / max(1.0, total - self.start_host[1]) * (os.cpu_count() or 1)
        )
        return self

    def describe(self) -> str:
        parts = [f"{name} {share * 100:.0f}%" for name, share in self.result.items()]
        rest = self.host_busy - sum(v for v in self.result.values() if not math.isnan(v))
        return (
            "cpu (% of one core): "
            + ", ".join(parts)
            + f"; redis+postgres+other {max(0.0, rest) * 100:.0f}%; host {self.host_busy * 100:.0f}% of "
            f"{(os.cpu_count() or 1) * 100}%"
        )


# --------------------------------------------------------------------------- recipients


@dataclass(frozen=True, slots=True)
class Recipient:
    id: bytes
    secret: bytes
    key: bytes
    topic: bytes


def make_topics(count: int) -> list[bytes]:
    return [b"\x00" + secrets.token_bytes(16) for _ in range(count)]


def make_recipients(count: int, topics: Sequence[bytes]) -> list[Recipient]:
    return [
        Recipient(
            secrets.token_bytes(32), secrets.token_bytes(32), secrets.token_bytes(32), topics[i % len(topics)]
        )
        for i in range(count)
    ]


async def register_over_grpc(
    grpc_port: int, recipients: Sequence[Recipient], url: str, concurrency: int
) -> float:
    started = time.monotonic()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]
        queue: asyncio.Queue[Recipient] = asyncio.Queue()
        for recipient in recipients:
            queue.put_nowait(recipient)

        async def one() -> None:
            while not queue.empty():
                r = queue.get_nowait()
                await stub.Register(
                    pb.RegisterRequest(
                        recipient_id=r.id,
                        recipient_secret=r.secret,
                        http=pb.HttpDelivery(url=url, signing_key=r.key),
                    ),
                    timeout=30,
                )
                await stub.UpdateSubscriptions(
                    pb.UpdateSubscriptionsRequest(
                        recipient_id=r.id, recipient_secret=r.secret, adds=[pb.Subscription(topic=r.topic)]
                    ),
                    timeout=30,
                )

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return time.monotonic() - started


async def copy_recipients(database_url: str, recipients: Sequence[Recipient], url: str) -> float:
    """Bulk insert recipients and their one subscription each (PostgreSQL COPY, or SQLite executemany)."""
    started = time.monotonic()
    now = time.time_ns()
    start_ns = now - 10 * 1_000_000_000
    recipient_rows = [
        (r.id, hashlib.sha256(r.secret).digest(), HTTP_CHANNEL, url, r.key, 1, now, now) for r in recipients
    ]
    subscription_rows = [(r.topic, r.id, start_ns, None, None, False) for r in recipients]
    recipient_columns = [
        "id",
        "secret_hash",
        "channel",
        "target",
        "signing_key",
        "topic_count",
        "created_ns",
        "renewed_ns",
    ]
    subscription_columns = [
        "topic",
        "recipient_id",
        "start_ns",
        "hmac_epoch_base",
        "hmac_keys",
        "include_commits",
    ]
    if database_url.startswith("sqlite"):
        import sqlite3

        path = database_url.split("///", 1)[1]
        connection = sqlite3.connect(path)
        with connection:
            connection.executemany(
                f"INSERT INTO recipients ({','.join(recipient_columns)}) VALUES (?,?,?,?,?,?,?,?)",
                recipient_rows,
            )
            connection.executemany(
                f"INSERT INTO subscriptions ({','.join(subscription_columns)}) VALUES (?,?,?,?,?,?)",
                subscription_rows,
            )
        connection.close()
    else:
        import asyncpg

        connection = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            async with connection.transaction():
                await connection.copy_records_to_table(
                    "recipients", records=recipient_rows, columns=recipient_columns
                )
                await connection.copy_records_to_table(
                    "subscriptions", records=subscription_rows, columns=subscription_columns
                )
            await connection.execute("ANALYZE recipients; ANALYZE subscriptions")
        finally:
            await connection.close()
    return time.monotonic() - started


# --------------------------------------------------------------------------- ingest


def envelope_json(topic: bytes, sequence_id: int) -> dict[str, Any]:
    return {
        "topic": base64.b64encode(topic).decode(),
        "sequence_id": str(sequence_id),
        "server_ns": time.time_ns(),
        "kind": "group_message",
        "should_push": True,
    }


@dataclass
class IngestLog:
    sent_ns: dict[int, int] = field(default_factory=dict)  # sequence_id -> monotonic ns the request was sent
    start_lag: list[float] = field(default_factory=list)  # open loop: scheduled -> sent, seconds
    request_seconds: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    first_sent: int = 0
    last_sent: int = 0
    last_done: int = 0


class Ingestor:
    def __init__(self, session: aiohttp.ClientSession, http_port: int) -> None:
        self.session = session
        self.url = f"http://127.0.0.1:{http_port}/v1/envelopes"
        self.headers = {"authorization": f"Bearer {INGEST_TOKEN}", "content-type": "application/json"}

    async def post(self, batch: Sequence[tuple[bytes, int]], log: IngestLog) -> None:
        body = json.dumps(
            {"envelopes": [envelope_json(t, s) for t, s in batch]}, separators=(",", ":")
        ).encode()
        sent = time.monotonic_ns()
        for _, sequence_id in batch:
            log.sent_ns[sequence_id] = sent
        if not log.first_sent:
            log.first_sent = sent
        log.last_sent = max(log.last_sent, sent)
        try:
            async with self.session.post(self.url, data=body, headers=self.headers) as response:
                await response.read()
                if response.status != 202:
                    log.errors[f"HTTP {response.status}"] += len(batch)
                    for _, sequence_id in batch:
                        log.sent_ns.pop(sequence_id, None)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.errors[type(error).__name__] += len(batch)
            for _, sequence_id in batch:
                log.sent_ns.pop(sequence_id, None)
        done = time.monotonic_ns()
        log.last_done = max(log.last_done, done)
        log.request_seconds.append((done - sent) / 1e9)

    async def closed_loop(
        self, envelopes: Sequence[tuple[bytes, int]], batch: int, concurrency: int
    ) -> IngestLog:
        log = IngestLog()
        batches = [envelopes[i : i + batch] for i in range(0, len(envelopes), batch)]
        position = iter(batches)

        async def one() -> None:
            for item in position:
                await self.post(item, log)

        await asyncio.gather(*(one() for _ in range(concurrency)))
        return log

    async def open_loop(
        self, envelopes: Sequence[tuple[bytes, int]], envelopes_per_second: float, tick: float
    ) -> IngestLog:
        """Every `tick` s the envelopes due by then go out as one request, whatever earlier ones are doing."""
        log = IngestLog()
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.05
        tasks: set[asyncio.Task[None]] = set()
        index = 0
        tick_no = 0
        while index < len(envelopes):
            scheduled = t0 + tick_no * tick
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            due = min(len(envelopes), round((tick_no + 1) * tick * envelopes_per_second))
            tick_no += 1
            if due <= index:
                continue
            batch = envelopes[index:due]
            index = due
            log.start_lag.append(loop.time() - scheduled)
            task = asyncio.create_task(self.post(batch, log))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return log


# --------------------------------------------------------------------------- the bare loop


async def bare_loop(
    port: int, deliveries: Sequence[tuple[Recipient, int]], concurrency: int
) -> tuple[float, int, collections.Counter[str]]:
    """The fastest plain client: sign and post each body, `concurrency` in flight; (seconds, ok, errors)."""
    from standardwebhooks.webhooks import Webhook

    url = f"http://127.0.0.1:{port}/hook"
    errors: collections.Counter[str] = collections.Counter()
    ok = 0
    connector = aiohttp.TCPConnector(limit=max(concurrency, 512), limit_per_host=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=10), skip_auto_headers=("User-Agent",)
    ) as session:
        work = iter(deliveries)

        async def one() -> None:
            nonlocal ok
            for recipient, sequence_id in work:
                topic = base64.b64encode(recipient.topic).decode()
                body = f'{{"topic":"{topic}","sequence_id":"{sequence_id}","recipient_id":"{recipient.id.hex()}"}}'
                message_id = f"bare_{sequence_id}_{recipient.id[:8].hex()}"
                now = int(time.time())
                headers = {
                    "content-type": "application/json",
                    "webhook-id": message_id,
                    "webhook-timestamp": str(now),
                    "webhook-signature": Webhook(recipient.key).sign(
                        message_id, datetime.fromtimestamp(now, tz=UTC), body
                    ),
                }
                try:
                    async with session.post(
                        url, data=body.encode(), headers=headers, allow_redirects=False
                    ) as response:
                        await response.read()
                        if 200 <= response.status < 300:
                            ok += 1
                        else:
                            errors[f"HTTP {response.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as error:
                    errors[type(error).__name__] += 1

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return elapsed, ok, errors


# --------------------------------------------------------------------------- analysis


@dataclass
class Receipts:
    expected: int
    unique: int
    duplicates: int
    missing: int
    unexpected: int
    bad_bodies: int
    latencies_ms: list[float]
    first_arrival: int
    last_arrival: int
    arrivals: list[int]  # sorted arrival ns of first receipts
    latency_by_arrival: list[tuple[int, float]]
    samples_checked: int
    samples_failed: int


def analyse(
    dump: dict[str, Any], expected: set[tuple[bytes, int]], sent_ns: dict[int, int], keys: dict[bytes, bytes]
) -> Receipts:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    seen: dict[tuple[bytes, int], int] = {}
    duplicates = unexpected = 0
    for recipient_hex, _topic, sequence_id, arrival in dump["records"]:
        key = (bytes.fromhex(recipient_hex), sequence_id)
        if key in seen:
            duplicates += 1
            seen[key] = min(seen[key], arrival)
            continue
        if key not in expected:
            unexpected += 1
            continue
        seen[key] = arrival
    latency_by_arrival = sorted(
        (arrival, (arrival - sent_ns[seq]) / 1e6) for (_, seq), arrival in seen.items() if seq in sent_ns
    )
    checked = failed = 0
    for headers, body in dump["samples"]:
        try:
            recipient = bytes.fromhex(json.loads(body)["recipient_id"])
            Webhook(keys[recipient]).verify(body, headers)
        except (WebhookVerificationError, KeyError, ValueError):
            failed += 1
        checked += 1
    arrivals = sorted(seen.values())
    return Receipts(
        expected=len(expected),
        unique=len(seen),
        duplicates=duplicates,
        missing=len(expected) - len(seen),
        unexpected=unexpected,
        bad_bodies=int(dump.get("bad", 0)),
        latencies_ms=sorted(latency for _, latency in latency_by_arrival),
        first_arrival=arrivals[0] if arrivals else 0,
        last_arrival=arrivals[-1] if arrivals else 0,
        arrivals=arrivals,
        latency_by_arrival=latency_by_arrival,
        samples_checked=checked,
        samples_failed=failed,
    )


def steady_rate(arrivals: Sequence[int], low: float = 0.1, high: float = 0.9) -> float:
    """Arrivals per second between the low and high quantiles of arrival order (no ramp-up or tail)."""
    if len(arrivals) < 20:
        return math.nan
    i, j = int(len(arrivals) * low), int(len(arrivals) * high) - 1
    span = (arrivals[j] - arrivals[i]) / 1e9
    return (j - i) / span if span > 0 else math.nan


def ms(values: Sequence[float], pct: float) -> float:
    return percentile(values, pct) if values else math.nan


def describe_receipts(r: Receipts) -> str:
    return (
        f"receipts: {r.unique}/{r.expected} unique, {r.missing} missing, {r.duplicates} duplicates, "
        f"{r.unexpected} unexpected, {r.bad_bodies} unparsable; signatures verified on "
        f"{r.samples_checked} samples, {r.samples_failed} failed"
    )


def describe_latency(values: Sequence[float]) -> str:
    if not values:
        return "latency: no receipts"
    return (
        f"ingest->receipt latency: p50 {ms(values, 50):.1f} ms, p90 {ms(values, 90):.1f} ms, "
        f"p99 {ms(values, 99):.1f} ms, max {values[-1]:.1f} ms (n={len(values)})"
    )


class Summary:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, metric: str, value: str, target: str = "", verdict: str = "") -> None:
        self.rows.append((metric, value, target, verdict))

    def print(self, title: str) -> None:
        headers = ("metric", "value", "target", "verdict")
        widths = [max(len(h), *(len(row[i]) for row in self.rows)) for i, h in enumerate(headers)]
        line = "+-" + "-+-".join("-" * w for w in widths) + "-+"
        print()
        print(f"== summary: {title} ==")
        print(line)
        print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
        print(line)
        for row in self.rows:
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        print(line)


def verdict(ok: bool) -> str:
    return "MEETS" if ok else "MISSES"


# --------------------------------------------------------------------------- set-up shared by scenarios


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
        f"host load average at start: {' '.join(Path('/proc/loadavg').read_text().split()[:3])} "
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
        f"warm-up: {len(envelopes)} envelopes, {count}/{expected} deliveries received (excluded){_errors(log)}"
    )
    await receiver.reset()
    return first_seq + len(envelopes)


def _errors(log: IngestLog) -> str:
    return f"; ingest errors {dict(log.errors)}" if log.errors else ""


# --------------------------------------------------------------------------- scenario: throughput


async def scenario_throughput(args: argparse.Namespace, summary: Summary) -> None:
    topics = make_topics(args.topics)
    recipients = make_recipients(args.subscribers, topics)
    keys = {r.id: r.key for r in recipients}
    envelopes = [(topics[j % len(topics)], 1_000_000 + j) for j in range(args.envelopes)]
    plan = delivery_plan(recipients, envelopes)
    expected = {(r.id, seq) for r, seq in plan}
    subs_per_topic = args.subscribers / args.topics
    print(
        f"load: {args.subscribers} HTTP recipients over {args.topics} topics ({subs_per_topic:g} per topic), "
        f"{args.envelopes} envelopes -> {len(plan)} deliveries; ingest "
        + (
            f"open loop at {args.rate:g} hints/s"
            if args.rate
            else f"as fast as possible, batches of {args.batch}, {args.ingest_concurrency} requests in flight"
        )
    )
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        hook = f"http://127.0.0.1:{port}/hook"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            receiver = ReceiverClient(session, port)
            bare_rate = bare_us = math.nan
            if not args.no_bare:
                print()
                print(
                    f"== bare loop: aiohttp, shared session, {args.bare_concurrency} in flight, standardwebhooks sign =="
                )
                cpu = CpuWindow({"receiver": receiver_proc.pid})
                elapsed, ok, errors = await bare_loop(port, plan, args.bare_concurrency)
                cpu.stop()
                bare_rate = ok / elapsed
                bare_us = cpu.seconds["bench"] / max(1, ok) * 1e6
                received = await receiver.count()
                print(
                    f"bare loop: {ok} posts ok in {elapsed:.2f} s = {bare_rate:,.0f} posts/s; receiver counted "
                    f"{received}; errors {dict(errors) or 0}"
                )
                print(cpu.describe())
                print(
                    f"bare loop CPU: {bare_us:.0f} us per post (client process), receiver "
                    f"{cpu.seconds['receiver'] / max(1, ok) * 1e6:.0f} us per post"
                )
                await receiver.reset()

            async with running_backend(args, database_url, redis_url) as backend:
                print()
                print("== ours: ingest -> fan-out -> delivery -> receiver ==")
                took = await register_over_grpc(
                    backend.grpc_port, recipients, hook, args.register_concurrency
                )
                print(
                    f"registration: {len(recipients)} Register + UpdateSubscriptions over gRPC in {took:.1f} s"
                )
                ingest = Ingestor(session, backend.http_port)
                await warm_up(ingest, receiver, recipients, topics, first_seq=1)
                pids = {p.name: p.pid for p in backend.procs} | {"receiver": receiver_proc.pid}
                cpu = CpuWindow(pids)
                if args.rate:
                    log = await ingest.open_loop(envelopes, args.rate / subs_per_topic, args.tick)
                else:
                    log = await ingest.closed_loop(envelopes, args.batch, args.ingest_concurrency)
                ingest_s = (log.last_done - log.first_sent) / 1e9
                print(
                    f"ingest: {len(log.sent_ns)} envelopes accepted in {ingest_s:.2f} s "
                    f"({len(log.request_seconds)} requests){_errors(log)}"
                )
                await receiver.wait_for(len(plan), stall_seconds=args.stall)
                cpu.stop()
                dump = await receiver.dump()
        receipts = analyse(dump, expected, log.sent_ns, keys)
        elapsed = (receipts.last_arrival - log.first_sent) / 1e9 if receipts.unique else math.nan
        ours = receipts.unique / elapsed if receipts.unique else 0.0
        steady = steady_rate(receipts.arrivals)
        print(describe_receipts(receipts))
        print(
            f"throughput: {receipts.unique} deliveries in {elapsed:.2f} s (first ingest send -> last receipt) = "
            f"{ours:,.0f} deliveries/s; steady (10%..90% of receipts) {steady:,.0f}/s"
        )
        print(describe_latency(receipts.latencies_ms))
        print(cpu.describe())
        backend_s = sum(v for n, v in cpu.seconds.items() if n.startswith(("worker", "dev", "api")))
        worker_s = sum(v for n, v in cpu.seconds.items() if n.startswith(("worker", "dev")))
        ours_us = backend_s / max(1, receipts.unique) * 1e6
        print(
            f"backend CPU: {ours_us:.0f} us per delivery (api + workers; workers alone "
            f"{worker_s / max(1, receipts.unique) * 1e6:.0f} us)"
        )
        if redis_client is not None:
            await redis_client.aclose()

    label = f"{args.mode}" + (f", {args.workers} worker(s)" if args.mode == "redis" else "")
    summary.add(
        "deliveries expected / received",
        f"{len(plan)} / {receipts.unique}",
        "all",
        verdict(receipts.missing == 0),
    )
    summary.add("duplicates / unexpected", f"{receipts.duplicates} / {receipts.unexpected}")
    summary.add(
        "signature samples ok",
        f"{receipts.samples_checked - receipts.samples_failed}/{receipts.samples_checked}",
        "all",
        verdict(receipts.samples_failed == 0),
    )
    summary.add(f"ours ({label}) deliveries/s, end to end", f"{ours:,.0f}")
    summary.add("ours deliveries/s, steady 10..90%", f"{steady:,.0f}")
    if not args.no_bare:
        summary.add(f"bare loop posts/s ({args.bare_concurrency} in flight)", f"{bare_rate:,.0f}")
        ratio = ours / bare_rate if bare_rate else math.nan
        summary.add(
            "ratio ours/bare (end to end)",
            f"{ratio * 100:.0f} %",
            f">= {RATIO_TARGET * 100:.0f} %",
            verdict(ratio >= RATIO_TARGET),
        )
        summary.add("ratio ours/bare (steady)", f"{steady / bare_rate * 100:.0f} %")
        summary.add("CPU us per delivery: ours (api+workers) / bare", f"{ours_us:.0f} / {bare_us:.0f}")
        summary.add(
            "CPU-normalised ratio (bare us / ours us)",
            f"{bare_us / ours_us * 100:.0f} %",
            "",
            "(load-independent)",
        )
    values = receipts.latencies_ms
    summary.add(
        "ingest->receipt p50 / p99",
        f"{ms(values, 50):.1f} / {ms(values, 99):.1f} ms",
        "(backlog drain)" if not args.rate else "",
    )


# --------------------------------------------------------------------------- scenario: fan-out


async def scenario_fanout(args: argparse.Namespace, summary: Summary) -> None:
    topic, warm_topic = make_topics(2)
    recipients = make_recipients(args.subscribers, [topic])
    warm = make_recipients(args.fanout_warmup, [warm_topic])
    keys = {r.id: r.key for r in [*recipients, *warm]}
    print(
        f"load: one envelope to a topic with {args.subscribers:,} HTTP subscribers (bulk-inserted), after a "
        f"warm-up envelope to a topic with {len(warm)}"
    )
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        hook = f"http://127.0.0.1:{port}/hook"
        took = await copy_recipients(database_url, [*recipients, *warm], hook)
        print(f"bulk insert: {len(recipients) + len(warm):,} recipients + subscriptions in {took:.1f} s")
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
            running_backend(args, database_url, redis_url) as backend,
        ):
            receiver = ReceiverClient(session, port)
            ingest = Ingestor(session, backend.http_port)
            warm_log = await ingest.closed_loop([(warm_topic, 1)], 1, 1)
            count, _ = await receiver.wait_for(len(warm), stall_seconds=10)
            print(f"warm-up: {count}/{len(warm)} received (excluded){_errors(warm_log)}")
            await receiver.reset()
            baseline = await entries_added(redis_client) if redis_client is not None else 0

            pids = {p.name: p.pid for p in backend.procs} | {"receiver": receiver_proc.pid}
            cpu = CpuWindow(pids)
            target = baseline + len(recipients)
            queued_at: int | None = None
            poll_samples: list[tuple[int, int]] = []

            async def watch_queue() -> None:
                nonlocal queued_at
                while True:
                    added = await entries_added(redis_client)
                    now = time.monotonic_ns()
                    poll_samples.append((now, added - baseline))
                    if added >= target:
                        queued_at = now
                        queue_cpu.stop()
                        return
                    await asyncio.sleep(0.002)

            queue_cpu = CpuWindow({p.name: p.pid for p in backend.workers})
            watcher = asyncio.create_task(watch_queue()) if redis_client is not None else None
            log = await ingest.closed_loop([(topic, 2)], 1, 1)
            sent = log.sent_ns.get(2)
            if sent is None:
                raise RuntimeError(f"the fan-out envelope was refused: {dict(log.errors)}")
            if watcher is not None:
                try:
                    await asyncio.wait_for(watcher, timeout=args.stall + 60)
                except TimeoutError:
                    print("fan-out: not every job was queued in time", file=sys.stderr)
            if not args.queue_only:
                count, _ = await receiver.wait_for(len(recipients), stall_seconds=args.stall)
            cpu.stop()
            dump = await receiver.dump()
        expected = {(r.id, 2) for r in recipients}
        if args.queue_only:  # only what had arrived by the time every job was queued
            expected = {(bytes.fromhex(rid), seq) for rid, _, seq, _ in dump["records"]}
        receipts = analyse(dump, expected, log.sent_ns, keys)
        queued_s = (queued_at - sent) / 1e9 if queued_at else math.nan
        first_s = (receipts.first_arrival - sent) / 1e9 if receipts.unique else math.nan
        all_s = (receipts.last_arrival - sent) / 1e9 if receipts.unique else math.nan
        print(describe_receipts(receipts))
        if redis_client is not None:
            # Progress of the queueing, from the watcher's samples.
            marks = []
            for fraction in (0.01, 0.25, 0.5, 0.75, 1.0):
                goal = int(len(recipients) * fraction)
                hit = next((t for t, n in poll_samples if n >= goal), None)
                marks.append(
                    f"{fraction * 100:.0f}% at {(hit - sent) / 1e9:.3f} s"
                    if hit
                    else f"{fraction * 100:.0f}% never"
                )
            print(
                f"delivery jobs queued (XINFO STREAM entries-added of {DELIVERY_STREAM}): " + ", ".join(marks)
            )
            if queued_at:
                used = sum(v for n, v in queue_cpu.seconds.items() if n.startswith("worker"))
                print(
                    f"worker CPU while queueing: {used:.2f} s over {queue_cpu.wall:.2f} s "
                    f"({used / queue_cpu.wall * 100:.0f}% of one core; the rest of the time it was "
                    "waiting for a core, the database or Redis)"
                )
                summary.add("worker CPU seconds used while queueing", f"{used:.2f} s")
        else:
            print("delivery jobs queued: not observable in memory mode (in-process queue); see receipts")
        print(
            f"receipts: first after {first_s:.3f} s, all after {all_s:.3f} s "
            f"({receipts.unique / all_s:,.0f} deliveries/s)"
        )
        print(cpu.describe())
        if redis_client is not None:
            await redis_client.aclose()
    summary.add("subscribers", f"{len(recipients):,}")
    summary.add(
        "ingest -> all delivery jobs queued",
        f"{queued_s:.3f} s" if queued_at else "n/a (memory)",
        f"<= {FANOUT_TARGET_S:g} s",
        verdict(queued_s <= FANOUT_TARGET_S) if queued_at else "",
    )
    summary.add("ingest -> first receipt", f"{first_s:.3f} s")
    summary.add("ingest -> all received", f"{all_s:.3f} s")
    summary.add(
        "received / missing / duplicates",
        f"{receipts.unique} / {receipts.missing} / {receipts.duplicates}",
        "no loss",
        verdict(receipts.missing == 0),
    )


# --------------------------------------------------------------------------- scenarios: latency and soak


async def scenario_rate(args: argparse.Namespace, summary: Summary) -> None:
    soak = args.scenario == "soak"
    topics = make_topics(args.topics)
    recipients = make_recipients(args.subscribers, topics)
    keys = {r.id: r.key for r in recipients}
    subs_per_topic = args.subscribers / args.topics
    envelope_rate = args.rate / subs_per_topic
    total = int(envelope_rate * args.duration)
    envelopes = [(topics[j % len(topics)], 1_000_000 + j) for j in range(total)]
    plan = delivery_plan(recipients, envelopes)
    expected = {(r.id, seq) for r, seq in plan}
    per_request = envelope_rate * args.tick
    print(
        f"load: {args.rate:g} hints/s for {args.duration:g} s = {envelope_rate:g} envelopes/s to {args.topics} topics "
        f"x {subs_per_topic:g} subscribers; open loop, one ingest request every {args.tick * 1000:g} ms "
        f"({per_request:g} envelopes each); {len(plan)} deliveries"
    )
    async with database(args) as database_url, running_receiver(args) as (receiver_proc, port):
        redis_url, redis_client = await prepare_redis(args)
        hook = f"http://127.0.0.1:{port}/hook"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
            running_backend(args, database_url, redis_url) as backend,
        ):
            receiver = ReceiverClient(session, port)
            took = await register_over_grpc(backend.grpc_port, recipients, hook, args.register_concurrency)
            print(f"registration: {len(recipients)} Register + UpdateSubscriptions over gRPC in {took:.1f} s")
            ingest = Ingestor(session, backend.http_port)
            await warm_up(ingest, receiver, recipients, topics, first_seq=1)
            watched = {p.name: p.pid for p in backend.procs}
            rss: dict[str, list[tuple[float, float]]] = {name: [] for name in watched}
            started = time.monotonic()

            async def sample_rss() -> None:
                while True:
                    for name, pid in watched.items():
                        rss[name].append((time.monotonic() - started, rss_mb(pid)))
                    if soak:
                        line = ", ".join(f"{n} {rss[n][-1][1]:.1f} MB" for n in watched)
                        print(
                            f"  t={time.monotonic() - started:5.0f} s  RSS: {line}  "
                            f"received {await receiver.count()}",
                            flush=True,
                        )
                    await asyncio.sleep(args.rss_every)

            sampler = asyncio.create_task(sample_rss())
            cpu = CpuWindow(watched | {"receiver": receiver_proc.pid})
            log = await ingest.open_loop(envelopes, envelope_rate, args.tick)
            await receiver.wait_for(len(plan), stall_seconds=args.stall)
            cpu.stop()
            for name, pid in watched.items():
                rss[name].append((time.monotonic() - started, rss_mb(pid)))
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            dump = await receiver.dump()
        receipts = analyse(dump, expected, log.sent_ns, keys)
        window = args.window or (60.0 if soak else 10.0)
        print(describe_receipts(receipts))
        achieved = (len(log.sent_ns) - 1) / ((log.last_sent - log.first_sent) / 1e9) * subs_per_topic
        lag = sorted(log.start_lag)
        print(
            f"ingest: {len(log.sent_ns)} envelopes in {len(log.request_seconds)} requests, issued at "
            f"{achieved:,.0f} hints/s; request time p50 {ms(sorted(log.request_seconds), 50) * 1000:.1f} ms, "
            f"p99 {ms(sorted(log.request_seconds), 99) * 1000:.1f} ms; send lag p99 {ms(lag, 99) * 1000:.1f} ms"
            f"{_errors(log)}"
        )
        print(describe_latency(receipts.latencies_ms))
        print(f"per {window:g} s window of arrival (p50 / p99 / max ms):")
        origin = receipts.latency_by_arrival[0][0] if receipts.latency_by_arrival else 0
        buckets: dict[int, list[float]] = collections.defaultdict(list)
        for arrival, latency in receipts.latency_by_arrival:
            buckets[int((arrival - origin) / 1e9 // window)].append(latency)
        for index in sorted(buckets):
            values = sorted(buckets[index])
            print(
                f"  {index * window:6.0f}..{(index + 1) * window:<6.0f} s  n={len(values):7d}  "
                f"{ms(values, 50):7.1f} / {ms(values, 99):7.1f} / {values[-1]:7.1f}"
            )
        print(cpu.describe())
        for name, samples in rss.items():
            values = [v for _, v in samples]
            print(
                f"RSS {name}: first {values[0]:.1f} MB, last {values[-1]:.1f} MB, min {min(values):.1f} MB, "
                f"max {max(values):.1f} MB over {len(values)} samples every {args.rss_every:g} s"
            )
        if redis_client is not None:
            await redis_client.aclose()

    values = receipts.latencies_ms
    summary.add("hints/s offered / issued", f"{args.rate:g} / {achieved:,.0f}")
    summary.add(
        "deliveries expected / received",
        f"{len(plan)} / {receipts.unique}",
        "all",
        verdict(receipts.missing == 0),
    )
    summary.add("duplicates", f"{receipts.duplicates}")
    summary.add("ingest->receipt p50", f"{ms(values, 50):.1f} ms")
    summary.add(
        "ingest->receipt p99",
        f"{ms(values, 99):.1f} ms",
        f"< {LATENCY_P99_TARGET_MS:g} ms",
        verdict(ms(values, 99) < LATENCY_P99_TARGET_MS),
    )
    summary.add("ingest->receipt max", f"{values[-1]:.1f} ms" if values else "n/a")
    worker_names = [n for n in rss if n.startswith("worker")] or ["dev"]
    for name in worker_names:
        mb = [v for _, v in rss[name]]
        summary.add(
            f"RSS {name} min / max",
            f"{min(mb):.1f} / {max(mb):.1f} MB",
            f"< {RSS_TARGET_MB:g} MB, flat",
            verdict(max(mb) < RSS_TARGET_MB),
        )
        if soak:
            half = len(mb) // 2
            summary.add(f"RSS {name} 2nd-half growth", f"{max(mb[half:]) - min(mb[half:]):.1f} MB")
    if "api" in rss:
        mb = [v for _, v in rss["api"]]
        summary.add("RSS api min / max", f"{min(mb):.1f} / {max(mb):.1f} MB")


# --------------------------------------------------------------------------- main


SCENARIO_DEFAULTS: dict[str, dict[str, Any]] = {
    "throughput": {"subscribers": 1000, "topics": 10, "envelopes": 1000, "rate": 0.0},
    "fanout": {"subscribers": 100_000},
    "latency": {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 30.0},
    "soak": {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 600.0},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=["memory", "redis"], default="redis")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (redis mode)")
    parser.add_argument("--scenario", choices=list(SCENARIO_DEFAULTS), default="throughput")
    parser.add_argument("--envelopes", type=int, help="throughput: envelopes to ingest (default 1000)")
    parser.add_argument(
        "--subscribers", type=int, help="recipients (throughput 1000, fanout 100000, latency 2000)"
    )
    parser.add_argument(
        "--topics", type=int, help="topics the recipients are spread over (throughput 10, latency 1000)"
    )
    parser.add_argument(
        "--rate", type=float, help="hints (deliveries) per second, open loop; 0 = as fast as possible"
    )
    parser.add_argument("--duration", type=float, help="latency/soak: seconds of load (30 / 600)")
    parser.add_argument(
        "--batch", type=int, default=100, help="throughput at full speed: envelopes per request"
    )
    parser.add_argument("--ingest-concurrency", type=int, default=4)
    parser.add_argument("--tick", type=float, default=0.01, help="open loop: seconds between ingest requests")
    parser.add_argument("--bare-concurrency", type=int, default=256)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare loop")
    parser.add_argument("--register-concurrency", type=int, default=32)
    parser.add_argument(
        "--fanout-warmup", type=int, default=200, help="fanout: subscribers of the warm-up topic"
    )
    parser.add_argument(
        "--queue-only",
        action="store_true",
        help="fanout: stop once every job is queued (do not wait for all receipts)",
    )
    parser.add_argument(
        "--stall", type=float, default=20.0, help="give up waiting after this long without a receipt"
    )
    parser.add_argument("--rss-every", type=float, default=10.0)
    parser.add_argument("--window", type=float, help="latency windows in seconds (10, soak 60)")
    parser.add_argument(
        "--sample-every", type=int, default=1000, help="receiver keeps headers of every Nth hook"
    )
    parser.add_argument("--receiver-port", type=int, default=0)
    parser.add_argument(
        "--db", choices=["postgres", "sqlite"], default="postgres", help="sqlite only with --mode memory"
    )
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--redis-db", type=int, default=13, help="dedicated Redis DB, flushed first")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra backend setting, e.g. DELIVERY_CONCURRENCY=512 (XMTP_PUSH_ prefix optional)",
    )
    args = parser.parse_args(argv)
    for name, value in SCENARIO_DEFAULTS[args.scenario].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name, value in {"envelopes": 1000, "topics": 1, "rate": 0.0, "duration": 30.0}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.db == "sqlite" and args.mode != "memory":
        parser.error("--db sqlite needs --mode memory (workers in several processes need PostgreSQL)")
    if args.scenario in ("latency", "soak") and not args.rate:
        parser.error("--rate must be > 0 for latency and soak")
    return args


async def amain(args: argparse.Namespace) -> int:
    header(args)
    summary = Summary()
    if args.scenario == "throughput":
        await scenario_throughput(args, summary)
    elif args.scenario == "fanout":
        await scenario_fanout(args, summary)
    else:
        await scenario_rate(args, summary)
    workers = f", {args.workers} worker(s)" if args.mode == "redis" else ""
    summary.print(f"{args.scenario}, {args.mode} mode{workers}, database {args.db}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
