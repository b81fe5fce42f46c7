"""Benchmark `python -m bench.registration [--rate 200] [--duration 10]`: Register and UpdateSubscriptions.

`xmtp-push api` runs in its own process, on a fresh migrated database or the --database-url one as it is,
driven over gRPC. Register call i is sent at t0 + i/rate whatever earlier calls do, and its latency counts
from then (no coordinated omission). UpdateSubscriptions calls, 1000 adds each, run one at a time."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from secrets import token_bytes
from typing import Any

import asyncpg
import grpc

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from bench import _support as support
from bench._support import DEFAULT_ADMIN_DSN, Results, host_busy_cpus, host_cpu, process_cpu_seconds, verdict

REGISTER_P99_TARGET_MS, UPDATE_P99_TARGET_MS, REGISTER_WARMUP_S, CALL_TIMEOUT_S = 15.0, 50.0, 2.0, 30.0
UPDATE_ADDS, UPDATE_RECIPIENTS, UPDATE_WARMUP_CALLS = 1000, 20, 20  # adds a call; its recipients; calls
WEBHOOK_URL = "http://127.0.0.1:9/hook"
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"


def cpu_seconds(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    return 0.0 if math.isnan(seconds) else seconds


async def backends_cpu(database: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend connected to the database (on this host)."""
    connection = await asyncpg.connect(DEFAULT_ADMIN_DSN)
    pids = [row["pid"] for row in await connection.fetch(BACKENDS, database)]
    await connection.close()
    return {pid: cpu_seconds(pid) for pid in pids}


@contextlib.asynccontextmanager
async def measured(args: argparse.Namespace, calls: int) -> AsyncIterator[None]:
    """The block with the client's collector paused (a full collection stalls every call in flight, charged
    to the server); then the CPU the server, client, PostgreSQL backends and whole host used meanwhile."""
    backends, host_start = await backends_cpu(args.database), host_cpu()
    start = (time.monotonic(), time.process_time(), cpu_seconds(args.server_pid))
    gc.collect()
    gc.freeze()
    gc.disable()
    yield  # an exception ends the run: no need to restore the collector
    gc.enable()
    gc.unfreeze()
    host = host_busy_cpus(host_start, host_cpu())
    end = (time.monotonic(), time.process_time(), cpu_seconds(args.server_pid))
    wall, client, server = (e - s for e, s in zip(end, start, strict=True))
    pids = set(backends) | set(await backends_cpu(args.database))
    postgres = sum(cpu_seconds(pid) - backends.get(pid, 0.0) for pid in pids)
    unrelated = max(0.0, host - (client + server + postgres) / wall)
    print(
        f"cpu (CPUs over {wall:.1f} s): server {server / wall:.2f}, client {client / wall:.2f}, postgres "
        f"{postgres / wall:.2f}; whole host {host:.2f} of {os.cpu_count()}, unrelated {unrelated:.2f}\n"
        f"cpu per call: {server / calls * 1000:.2f} ms server, {postgres / calls * 1000:.2f} ms postgres"
    )


def register_request() -> pb.RegisterRequest:
    http = pb.HttpDelivery(url=WEBHOOK_URL, signing_key=token_bytes(32))
    return pb.RegisterRequest(recipient_id=token_bytes(32), recipient_secret=token_bytes(32), http=http)


def update_request(recipient: pb.RegisterRequest, adds: int, epoch: int) -> pb.UpdateSubscriptionsRequest:
    """`adds` fresh group topics (0x00 + 16 bytes), each with 3 hmac keys of 42 bytes."""
    request = pb.UpdateSubscriptionsRequest(recipient_id=recipient.recipient_id)
    request.recipient_secret = recipient.recipient_secret
    for i in range(adds):
        keys = [token_bytes(42) for _ in range(3)]
        topic = b"\x00" + token_bytes(16)
        request.adds.add(topic=topic, hmac_epoch_base=epoch, hmac_keys=keys, include_commits=bool(i & 1))
    return request


@dataclass
class Calls:
    latencies: list[float] = field(default_factory=list)  # due (open loop) or sent -> reply
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    first: float = 0.0  # when the first call was due
    last_sent: float = 0.0
    last_done: float = 0.0


async def open_loop(rate: float, requests: list[Any], call: Callable[[Any], Awaitable[None]]) -> Calls:
    """Start call i at t0 + i/rate regardless of earlier calls; latency counted from that moment."""
    loop = asyncio.get_running_loop()
    calls = Calls(first=loop.time() + 0.05)

    async def one(scheduled: float, request: Any) -> None:
        try:
            await call(request)
        except grpc.aio.AioRpcError as error:
            calls.errors[error.code().name] += 1
            return
        done = loop.time()
        calls.last_done = max(calls.last_done, done)
        calls.latencies.append(done - scheduled)

    tasks = []
    for i, request in enumerate(requests):
        scheduled = calls.first + i / rate
        if scheduled > loop.time():
            await asyncio.sleep(scheduled - loop.time())
        tasks.append(asyncio.create_task(one(scheduled, request)))
        calls.last_sent = loop.time()
    await asyncio.gather(*tasks)
    return calls


async def sequential(stub: Any, requests: list[Any], topics: dict[bytes, int]) -> Calls:
    """One call at a time; each reply's topic_count checked against the adds sent so far."""
    loop = asyncio.get_running_loop()
    calls = Calls(first=loop.time())
    for request in requests:
        sent = loop.time()
        try:
            reply = await stub.UpdateSubscriptions(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            calls.errors[error.code().name] += 1
            continue
        calls.last_done = loop.time()
        calls.latencies.append(calls.last_done - sent)
        topics[request.recipient_id] += len(request.adds)
        if reply.topic_count != topics[request.recipient_id]:
            calls.errors["topic_count mismatch"] += 1
    return calls


def report(results: Results, name: str, calls: Calls, target_ms: float, condition: str) -> None:
    """The latency line, and the rows: p50; p99 against the target; errors."""
    summary = support.summarize_ms(calls.latencies)
    print(f"{name}: {support.format_ms(summary)}")
    ok = summary["p99"] < target_ms and not calls.errors
    results.add(f"{name} p50", f"{summary['p50']:.2f} ms")
    goal = f"< {target_ms:g} ms{condition}, no errors"
    results.add(f"{name} p99", f"{summary['p99']:.2f} ms", goal, verdict(ok))
    results.add(f"{name} errors", f"{dict(calls.errors) or 0}", "0", verdict(not calls.errors))


async def bench_register(stub: Any, args: argparse.Namespace, results: Results) -> None:
    async def call(request: pb.RegisterRequest) -> None:
        reply = await stub.Register(request, timeout=CALL_TIMEOUT_S)
        assert reply.channel == pb.CHANNEL_HTTP and reply.topic_count == 0

    print(f"\n== (a) Register, open loop at {args.rate:g} calls/s, {REGISTER_WARMUP_S:g} s warm-up first ==")
    warm = [register_request() for _ in range(int(args.rate * REGISTER_WARMUP_S))]
    requests = [register_request() for _ in range(int(args.rate * args.duration))]
    await open_loop(args.rate, warm, call)
    async with measured(args, len(requests)):
        calls = await open_loop(args.rate, requests, call)
    report(results, f"Register at {args.rate:g} calls/s", calls, REGISTER_P99_TARGET_MS, " at 200 calls/s")
    issued = (len(requests) - 1) / max(1e-9, calls.last_sent - calls.first)
    completed = len(calls.latencies) / (calls.last_done - calls.first)
    results.add("Register rate issued / completed", f"{issued:.1f} / {completed:.1f} calls/s")


async def bench_update(stub: Any, args: argparse.Namespace, results: Results) -> None:
    adds, warm_n, n = UPDATE_ADDS, UPDATE_WARMUP_CALLS, UPDATE_WARMUP_CALLS + args.update_calls
    print(f"\n== (b) UpdateSubscriptions, {adds} adds per call, one at a time after {warm_n} of warm-up ==")
    recipients = [register_request() for _ in range(UPDATE_RECIPIENTS)]
    await asyncio.gather(*(stub.Register(r, timeout=CALL_TIMEOUT_S) for r in recipients))
    topics = {r.recipient_id: 0 for r in recipients}
    # Round-robin over the recipients, a fresh hmac epoch base for each call.
    requests = [update_request(recipients[i % UPDATE_RECIPIENTS], adds, 1001 + i) for i in range(n)]
    await sequential(stub, requests[:warm_n], topics)
    async with measured(args, args.update_calls):
        calls = await sequential(stub, requests[warm_n:], topics)
    report(results, f"UpdateSubscriptions({adds} adds)", calls, UPDATE_P99_TARGET_MS, "")
    rate = len(calls.latencies) / (calls.last_done - calls.first)
    results.add("UpdateSubscriptions throughput", f"{rate:.1f} calls/s = {rate * adds:,.0f} subscriptions/s")


async def main_async(args: argparse.Namespace) -> int:
    print(f"{support.environment_line()}; load average {support.load_average()}")
    results = Results(f"Register at {args.rate:g}/s and UpdateSubscriptions over gRPC")
    given = contextlib.nullcontext(args.database_url)  # used as it is, never dropped
    async with given if args.database_url else support.bench_database() as url:
        server = await support.start_xmtp_push("api", support.server_env(url), support.SERVING)
        try:
            port = int(server.match.group(2))
            print(f"server: `xmtp-push api`, pid {server.pid}, gRPC on 127.0.0.1:{port}")
            args.server_pid, args.database = server.pid, url.rsplit("/", 1)[1]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await channel.channel_ready()
                stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]
                await bench_register(stub, args, results)
                await bench_update(stub, args, results)
        finally:
            await support.stop_process(server)
    results.print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.registration", description=__doc__)
    parser.add_argument("--database-url", metavar="URL", help="a migrated database to use as it is")
    parser.add_argument("--rate", type=float, default=200.0, help="Register calls per second (open loop)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured Register seconds")
    parser.add_argument("--update-calls", type=int, default=300, help="measured UpdateSubscriptions calls")
    sys.exit(asyncio.run(main_async(parser.parse_args())))
