"""Benchmark (not a test): the delivery pipeline end to end, in the scenarios bench/pipeline/scenarios.py
describes. Here, shared with bench.channels: the backend's processes, the receiver, ingest, CPU use."""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import math
import os
import pathlib
import re
import secrets
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench import _support as support
from bench._support import Proc, host_busy_cpus, host_cpu, process_cpu_seconds

INGEST_TOKEN = "bench-ingest-token-" + secrets.token_hex(8)
RECEIVER_READY = re.compile(r"receiver listening on (\d+)")
Envelopes = Sequence[tuple[bytes, int]]  # (topic, sequence id)


class CpuWindow:
    """CPU used from construction to `stop()` by the named processes, this one ("bench") and the host."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {**procs, "bench": os.getpid()}
        self.start_wall = time.monotonic()
        self.start = {name: process_cpu_seconds(pid) for name, pid in self.procs.items()}
        self.start_host = host_cpu()
        self.result: dict[str, float] = {}

    def stop(self) -> CpuWindow:
        self.wall = time.monotonic() - self.start_wall
        self.seconds = {name: process_cpu_seconds(pid) - self.start[name] for name, pid in self.procs.items()}
        self.result = {name: used / self.wall for name, used in self.seconds.items()}
        self.host_busy = host_busy_cpus(self.start_host, host_cpu())
        return self

    def describe(self) -> str:
        parts = ", ".join(f"{name} {share * 100:.0f}%" for name, share in self.result.items())
        rest = max(0.0, self.host_busy - sum(v for v in self.result.values() if not math.isnan(v)))
        host = f"host {self.host_busy * 100:.0f}% of {(os.cpu_count() or 1) * 100}%"
        return f"cpu (% of one core): {parts}; redis+postgres+other {rest * 100:.0f}%; {host}"


def backend_env(args: Namespace, database_url: str, redis_url: str | None) -> dict[str, str]:
    settings = {"INGEST_TOKEN": INGEST_TOKEN} | ({"REDIS_URL": redis_url} if redis_url else {})
    if partitions := getattr(args, "partitions", None):  # bench.channels shares this, without the flag
        settings["QUEUE_PARTITIONS"] = str(partitions)
    settings |= (item.removeprefix("XMTP_PUSH_").split("=", 1) for item in args.env)  # NAME=VALUE
    return support.server_env(database_url, **settings)


@dataclass
class Backend:
    http_port: int
    grpc_port: int
    procs: list[Proc]  # api (memory mode: dev), then the workers


@contextlib.asynccontextmanager
async def running_backend(args: Namespace, database: str, redis_url: str | None) -> AsyncIterator[Backend]:
    """Memory mode one `xmtp-push dev`; redis mode one `xmtp-push api` and `args.workers` workers."""
    env, procs = backend_env(args, database, redis_url), list[Proc]()
    roles = ["dev"] if args.mode == "memory" else ["api", *(f"worker-{n}" for n in range(args.workers))]
    try:
        for name in roles:  # each in `procs` as soon as it runs, for the clean-up
            ready = support.WORKER_READY if name.startswith("worker") else support.SERVING
            procs.append(await support.start_xmtp_push(name, env, ready))
        backend = Backend(int(procs[0].match.group(1)), int(procs[0].match.group(2)), procs)
        described = ", ".join(f"{p.name} pid {p.pid}" for p in procs)
        print(f"backend: {args.mode} mode: {described}; HTTP {backend.http_port}, gRPC {backend.grpc_port}")
        yield backend
    finally:
        for proc in reversed(procs):
            if (code := await support.stop_process(proc)) not in (0, None):
                print(f"backend: {proc.name} exited with {code}", file=sys.stderr)


@contextlib.asynccontextmanager
async def running_receiver() -> AsyncIterator[tuple[Proc, int]]:
    """`bench.receiver` in its own process: (the process, its port)."""
    command = [sys.executable, "-m", "bench.receiver"]
    proc = await support.start_process("receiver", command, dict(os.environ), RECEIVER_READY)
    print(f"receiver: pid {proc.pid}, port {proc.match.group(1)} (raw asyncio + httptools + uvloop)")
    try:
        yield proc, int(proc.match.group(1))
    finally:
        await support.stop_process(proc)


class ReceiverClient:
    """The receiver's control routes."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session, self.base = session, f"http://127.0.0.1:{port}"

    async def count(self) -> int:
        async with self.session.get(self.base + "/stats") as response:
            return int((await response.json())["count"])

    async def reset(self) -> None:
        async with self.session.post(self.base + "/reset") as response:
            response.raise_for_status()

    async def dump(self) -> dict[str, Any]:
        """Every arrival and the sampled headers, through a file: far too big for a response."""
        with tempfile.TemporaryDirectory(prefix="bench-receiver-") as folder:
            path, timeout = pathlib.Path(folder, "dump.json"), aiohttp.ClientTimeout(total=300)
            async with self.session.post(f"{self.base}/dump", data=bytes(path), timeout=timeout) as response:
                response.raise_for_status()
            dump: dict[str, Any] = json.loads(await asyncio.to_thread(path.read_bytes))
        return dump

    async def wait_for(self, expected: int, stall_seconds: float, poll: float = 0.1) -> tuple[int, float]:
        """Poll until `expected` arrivals or no progress for stall_seconds; (count, monotonic when done)."""
        last, last_change = -1, time.monotonic()
        while True:
            count, now = await self.count(), time.monotonic()
            if count >= expected or (count == last and now - last_change > stall_seconds):
                return count, now
            if count != last:
                last, last_change = count, now
            await asyncio.sleep(poll)


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
    """Envelopes into the backend over `POST /v1/envelopes`, a batch a request, closed or open loop."""

    def __init__(self, session: aiohttp.ClientSession, http_port: int) -> None:
        self.session, self.url = session, f"http://127.0.0.1:{http_port}/v1/envelopes"
        self.headers = {"authorization": f"Bearer {INGEST_TOKEN}", "content-type": "application/json"}

    async def post(self, batch: Envelopes, log: IngestLog) -> None:
        envelopes = [dict[str, Any](topic=base64.b64encode(t).decode(), sequence_id=str(s)) for t, s in batch]
        for envelope in envelopes:
            envelope.update(server_ns=time.time_ns(), kind="group_message", should_push=True)
        body, sent = json.dumps({"envelopes": envelopes}, separators=(",", ":")).encode(), time.monotonic_ns()
        log.sent_ns.update((sequence_id, sent) for _, sequence_id in batch)
        log.first_sent, log.last_sent = log.first_sent or sent, max(log.last_sent, sent)
        try:
            async with self.session.post(self.url, data=body, headers=self.headers) as response:
                await response.read()
                refused = "" if response.status == 202 else f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            refused = type(error).__name__
        if refused:  # not sent, as far as latency goes
            log.errors[refused] += len(batch)
            for _, sequence_id in batch:
                log.sent_ns.pop(sequence_id, None)
        done = time.monotonic_ns()
        log.last_done = max(log.last_done, done)
        log.request_seconds.append((done - sent) / 1e9)

    async def closed_loop(self, envelopes: Envelopes, batch: int, concurrency: int) -> IngestLog:
        log, batches = IngestLog(), iter([envelopes[i : i + batch] for i in range(0, len(envelopes), batch)])

        async def one() -> None:
            for item in batches:
                await self.post(item, log)

        await asyncio.gather(*(one() for _ in range(concurrency)))
        return log

    async def open_loop(self, envelopes: Envelopes, envelopes_per_second: float, tick: float) -> IngestLog:
        """Every `tick` s the envelopes due by then go out as one request, whatever earlier ones are doing."""
        log, loop, tasks = IngestLog(), asyncio.get_running_loop(), set[asyncio.Task[None]]()
        t0, index, tick_no = loop.time() + 0.05, 0, 0
        while index < len(envelopes):
            scheduled = t0 + tick_no * tick
            if (delay := scheduled - loop.time()) > 0:
                await asyncio.sleep(delay)
            tick_no += 1
            if (due := min(len(envelopes), round(tick_no * tick * envelopes_per_second))) > index:
                log.start_lag.append(loop.time() - scheduled)
                tasks.add(task := asyncio.create_task(self.post(envelopes[index:due], log)))
                task.add_done_callback(tasks.discard)
                index = due
        await asyncio.gather(*tasks)
        return log
