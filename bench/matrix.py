"""Benchmark (not a test): the Matrix push gateway against a bare aioapns loop, same fake APNs, same bodies.

    python -m bench.matrix [--requests N] [--concurrency C] [--duration S] [--redis-url URL] [--json PATH]
    python -m bench matrix [--duration S]

One run:
1. starts the local APNs fake in its own process (`python -m app.testing.fake_apns`: TLS, HTTP/2);
2. renders N one-device `event_id_only` notifications (a base64 pushkey each, as Matrix iOS clients
   send them, unique event ids) with the gateway's own parser and APNs renderer, which gives the
   exact body and hex token APNs gets for each;
3. the *bare loop*, in this process: aioapns's `APNs` client (4 connections, as the gateway's
   provider) sends those N bodies to those tokens, C in flight: its CPU is this process's;
4. the gateway: `xmtp-push gateway` (no database, no Redis) with an XMTP_PUSH_MATRIX_APPS file holding
   one APNs app pointed at the fake; N `POST /_matrix/push/v1/notify` requests, C in flight, over
   keep-alive HTTP/1.1 from this process; each answer must be 200 `{"rejected": []}`. Its CPU is the
   gateway process's alone (the load generator's is not counted);
5. the soak: the same load for `--duration` seconds (default 20; 300 for the five-minute run), the
   gateway's resident memory read every second. Every delivered notification is remembered for ten
   minutes to drop a homeserver's repeats (up to 250,000 keys), so memory grows with the requests
   of the last ten minutes by design; the verdict is on what grows beyond that: the growth after the
   first fifth of the soak, less what the remembered keys take (measured in this process).

Rates: requests / (time of the last request at the fake - time the first one was sent), both clocks
CLOCK_MONOTONIC. CPU per request: the process's CPU seconds over the timed window / N. Targets: the
gateway's CPU per request at most 1.1 times the bare loop's, its rate at least 0.7 of it. The rates share
the host: with the gateway three processes are busy (the load's driver, the gateway, the fake) where the
bare loop has two, so on a small host the rate ratio is bounded by the driver's CPU, printed beside.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from app.matrix.apns import ApnsOptions, render_push
from app.matrix.duplicates import ProcessMemory, delivery_key
from app.matrix.notification import parse_notification
from app.testing import keys
from bench._proc import load_average, process_cpu_seconds, rss_mb
from bench._processes import Proc, start_process, stop_process, xmtp_push_command
from bench._results import Results
from bench._results import verdict as meets
from bench._support import environment_line, format_ms, run_on_fastest_loop, service_collector, summarize_ms
from bench.channels import BUNDLE_ID, KEY_ID, TEAM_ID, Fake, bare_apns_client, running_fake

APP_ID = "org.example.bench.ios"
NOTIFY_PATH = "/_matrix/push/v1/notify"
CPU_TARGET = 1.1  # gateway CPU per request / bare loop's, at most
RATE_TARGET = 0.7  # gateway requests/s / bare loop's, at least
FLAT_TARGET_MB = 5.0  # soak: growth beyond the remembered keys, at most
_GATEWAY_READY = re.compile(r"serving the Matrix push gateway on (?:HTTP port )?(?:[^\s:]+:)?(\d+)")


@dataclass(frozen=True)
class Notify:
    body: bytes  # the notify request
    token: str  # the hex device token APNs gets
    payload: dict[str, Any]  # the APNs body the gateway renders


def notifications(count: int, salt: str) -> list[Notify]:
    """`count` one-device event_id_only notifications and what the gateway sends for each."""
    made = []
    options = ApnsOptions(push_type=None, convert_device_token_to_hex=True)
    for n in range(count):
        pushkey = base64.b64encode(secrets.token_bytes(32)).decode()
        notification = {
            "event_id": f"${salt}{n}:bench.example.org",
            "room_id": f"!room{n % 500}:bench.example.org",
            "counts": {"unread": 1 + n % 9},
            "prio": "high",
            "devices": [
                {
                    "app_id": APP_ID,
                    "pushkey": pushkey,
                    "pushkey_ts": 1_700_000_000,
                    "data": {"format": "event_id_only"},
                }
            ],
        }
        body = json.dumps({"notification": notification}).encode()
        parsed = parse_notification(body)
        push = render_push(options, parsed, parsed.devices[0])
        assert push is not None and isinstance(push.payload, bytes)
        made.append(Notify(body, push.address, json.loads(push.payload)))
    return made


def gateway_config(fake: Fake, folder: str) -> str:
    key_file = os.path.join(folder, "apns.p8")
    Path(key_file).write_text(keys.apns_key_pem())
    config = os.path.join(folder, "sygnal.yaml")
    Path(config).write_text(
        "apps:\n"
        f"  {APP_ID}:\n"
        "    type: apns\n"
        f"    keyfile: {key_file}\n"
        f"    key_id: {KEY_ID}\n"
        f"    team_id: {TEAM_ID}\n"
        f"    topic: {BUNDLE_ID}\n"
        f"    endpoint: https://127.0.0.1:{fake.send_port}\n"
        f"    ca_file: {fake.ca_file}\n"
    )
    return config


# --------------------------------------------------------------------------- the bare loop


async def run_bare(
    fake: Fake, session: aiohttp.ClientSession, plan: Sequence[Notify], concurrency: int
) -> Run:
    from aioapns.common import NotificationRequest, PushType

    client = bare_apns_client(fake)

    async def send(item: Notify) -> bool:
        request = NotificationRequest(
            device_token=item.token, message=item.payload, priority=10, push_type=PushType.ALERT
        )
        result = await asyncio.wait_for(client.send_notification(request), 10)
        return bool(result.is_successful)

    try:
        await drive(send, plan[: min(200, len(plan))], concurrency)  # connections and the JWT
        await fake.reset(session)
        with service_collector():
            return await timed(fake, session, send, plan, concurrency, os.getpid())
    finally:
        client.pool.close()


# --------------------------------------------------------------------------- the gateway


async def start_gateway(config: str, redis_url: str | None = None) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_")}
    env.update(
        {"XMTP_PUSH_MATRIX_APPS": config, "XMTP_PUSH_HTTP_HOST": "127.0.0.1", "XMTP_PUSH_HTTP_PORT": "0"}
    )
    if redis_url:  # the duplicate memory in Redis: the process remembers nothing itself
        env["XMTP_PUSH_REDIS_URL"] = redis_url
    proc = await start_process("gateway", [*xmtp_push_command(), "gateway"], env, _GATEWAY_READY)
    print(f"gateway: pid {proc.pid}, HTTP on {proc.match.group(1)}")
    return proc


def notify_sender(session: aiohttp.ClientSession, port: int) -> Any:
    url = f"http://127.0.0.1:{port}{NOTIFY_PATH}"
    headers = {"content-type": "application/json"}

    async def send(item: Notify) -> bool:
        async with session.post(url, data=item.body, headers=headers) as response:
            answer = await response.read()
            return response.status == 200 and answer == b'{"rejected":[]}'

    return send


async def run_gateway(
    fake: Fake,
    session: aiohttp.ClientSession,
    gateway: Proc,
    warm: Sequence[Notify],
    plan: Sequence[Notify],
    concurrency: int,
) -> Run:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as client:
        send = notify_sender(client, int(gateway.match.group(1)))
        await drive(send, warm, concurrency)
        await fake.reset(session)
        return await timed(fake, session, send, plan, concurrency, gateway.pid)


# --------------------------------------------------------------------------- driving and timing


@dataclass
class Run:
    sent: int
    ok: int
    arrived: int  # distinct (token, body) pairs at the fake
    seconds: float
    cpu_seconds: float  # of the measured process
    latencies: list[float]
    driver_cpu_seconds: float  # of this process, which drives the load (the same process for the bare loop)

    @property
    def rate(self) -> float:
        return self.arrived / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_request_us(self) -> float:
        return self.cpu_seconds / self.sent * 1e6 if self.sent else float("nan")


async def drive(
    send: Any, work: Sequence[Notify], concurrency: int, latencies: list[float] | None = None
) -> int:
    """Send every item with `concurrency` in flight; how many were answered as delivered."""
    items = iter(work)
    ok = 0

    async def one() -> None:
        nonlocal ok
        for item in items:
            started = time.perf_counter()
            try:
                delivered = bool(await send(item))
                ok += delivered
            except Exception as error:  # counted as not delivered; the first few said
                if ok < 3:
                    print(f"  send failed: {type(error).__name__}: {error}", file=sys.stderr)
            if latencies is not None:
                latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return ok


async def timed(
    fake: Fake, session: aiohttp.ClientSession, send: Any, plan: Sequence[Notify], concurrency: int, pid: int
) -> Run:
    latencies: list[float] = []
    cpu_before, driver_before = process_cpu_seconds(pid), process_cpu_seconds(os.getpid())
    started = time.monotonic_ns()
    ok = await drive(send, plan, concurrency, latencies)
    cpu = process_cpu_seconds(pid) - cpu_before
    driver = process_cpu_seconds(os.getpid()) - driver_before
    stats = await fake.wait_for(session, len(plan), 30.0)
    seconds = (stats["last_ns"] - started) / 1e9
    return Run(len(plan), ok, stats["unique"], seconds, cpu, latencies, driver)


def describe(label: str, run: Run) -> str:
    return (
        f"{label}: {run.arrived:,} of {run.sent:,} at the fake ({run.ok:,} answered delivered) in "
        f"{run.seconds:.2f} s = {run.rate:,.0f}/s; CPU {run.cpu_per_request_us:.0f} us per request "
        f"(the load's driver: {run.driver_cpu_seconds / run.sent * 1e6:.0f} us)\n"
        f"  latency {format_ms(summarize_ms(run.latencies))}"
    )


# --------------------------------------------------------------------------- the soak


async def key_bytes(count: int = 100_000) -> float:
    """What one remembered delivery costs the gateway's process memory, in bytes."""
    memory = ProcessMemory()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(count):
        await memory.remember(delivery_key(APP_ID, f"pushkey{n}", f"$event{n}"))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / count


async def soak(gateway: Proc, seconds: float, concurrency: int, salt: str) -> dict[str, float]:
    """The load for `seconds`, resident memory every second; returns the readings that count."""
    port = int(gateway.match.group(1))
    samples: list[tuple[float, float, int]] = []  # (t, rss MiB, requests so far)
    sent = 0
    batch = notifications(2000, salt)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as client:
        send = notify_sender(client, port)
        started = time.monotonic()
        stop_at = started + seconds
        round_number = 0
        next_sample = started
        while time.monotonic() < stop_at:
            round_number += 1
            # New event ids each round: a repeat would be answered from memory without a push.
            work = [
                Notify(
                    item.body.replace(salt.encode(), f"{salt}r{round_number}x".encode()),
                    item.token,
                    item.payload,
                )
                for item in batch
            ]
            await drive(send, work, concurrency)
            sent += len(work)
            if time.monotonic() >= next_sample:
                samples.append((time.monotonic() - started, rss_mb(gateway.pid), sent))
                next_sample += 1.0
        samples.append((time.monotonic() - started, rss_mb(gateway.pid), sent))
    settled = samples[max(0, len(samples) // 5 - 1)]
    last = samples[-1]
    return {
        "seconds": last[0],
        "requests": float(last[2]),
        "rss_start_mb": samples[0][1],
        "rss_settled_mb": settled[1],
        "rss_end_mb": last[1],
        "requests_after_settled": float(last[2] - settled[2]),
        "samples": float(len(samples)),
    }


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=20_000, help="notify requests per timed run (N)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (C)")
    parser.add_argument(
        "--duration", type=float, default=20.0, help="soak seconds (300: the five-minute run)"
    )
    parser.add_argument(
        "--redis-url",
        help="keep the duplicate memory in this Redis (FLUSHDB first): the soak then shows the process's "
        "own growth, with no remembered deliveries in it",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the measured numbers as JSON to PATH")
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    print(environment_line())
    print(f"host load average at start: {load_average()}")
    salt = secrets.token_hex(4)
    plan = notifications(args.requests, salt)
    warm = notifications(min(500, args.requests), salt + "w")
    print(f"{args.requests:,} one-device event_id_only notifications, {args.concurrency} in flight")
    if args.redis_url:
        from redis.asyncio import Redis

        client = Redis.from_url(args.redis_url)
        await client.flushdb()
        await client.aclose()
        print(f"duplicate memory in Redis: {args.redis_url} (FLUSHDB done)")
    results = Results("matrix", "Matrix gateway vs a bare aioapns loop, one-device notify, same fake APNs")
    results.info["run"] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "soak_s": args.duration,
    }
    async with running_fake("apns") as fake, aiohttp.ClientSession() as session:
        bare = await run_bare(fake, session, plan, args.concurrency)
        print(describe("bare loop (aioapns APNs client)", bare))
        with tempfile.TemporaryDirectory(prefix="bench-matrix-") as folder:
            gateway = await start_gateway(gateway_config(fake, folder), args.redis_url)
            try:
                ours = await run_gateway(fake, session, gateway, warm, plan, args.concurrency)
                print(describe("gateway (xmtp-push gateway)", ours))
                memory = await soak(gateway, args.duration, args.concurrency, salt + "s")
            finally:
                await stop_process(gateway)
    # With the memory in Redis the process keeps no key: all its growth counts.
    record(results, bare, ours, memory, 0.0 if args.redis_url else await key_bytes())
    results.write(args.json)
    return 0 if bare.arrived == bare.sent and ours.arrived == ours.sent else 1


def record(results: Results, bare: Run, ours: Run, memory: dict[str, float], per_key: float) -> None:
    for label, run in (("bare loop", bare), ("gateway", ours)):
        results.add(
            f"{label}: requests at the fake / sent",
            f"{run.arrived:,} / {run.sent:,}",
            "all",
            meets(run.arrived == run.sent),
            value=run.arrived,
        )
        results.add(f"{label}: requests/s", f"{run.rate:,.0f}", value=run.rate, unit="requests/s")
        results.add(
            f"{label}: CPU per request",
            f"{run.cpu_per_request_us:.0f} us",
            value=run.cpu_per_request_us,
            unit="us",
        )
    summary = summarize_ms(ours.latencies)
    results.add("gateway: latency p50", f"{summary['p50']:.2f} ms", value=summary["p50"], unit="ms")
    results.add("gateway: latency p99", f"{summary['p99']:.2f} ms", value=summary["p99"], unit="ms")
    cpu_ratio = ours.cpu_per_request_us / bare.cpu_per_request_us
    rate_ratio = ours.rate / bare.rate if bare.rate else float("nan")
    results.add(
        "CPU per request gateway/bare",
        f"{cpu_ratio:.2f}x",
        f"<= {CPU_TARGET}x",
        meets(cpu_ratio <= CPU_TARGET),
        value=cpu_ratio,
    )
    results.add(
        "requests/s gateway/bare",
        f"{rate_ratio * 100:.0f} %",
        f">= {RATE_TARGET * 100:.0f} %",
        meets(rate_ratio >= RATE_TARGET),
        value=rate_ratio * 100,
        unit="%",
    )
    grown = memory["rss_end_mb"] - memory["rss_settled_mb"]
    remembered = memory["requests_after_settled"] * per_key / 2**20
    beyond = grown - remembered
    print(
        f"soak: {memory['requests']:,.0f} requests in {memory['seconds']:.0f} s; gateway RSS {memory['rss_start_mb']:.1f} MiB "
        f"at the start, {memory['rss_settled_mb']:.1f} after the first fifth, {memory['rss_end_mb']:.1f} at the end: "
        f"+{grown:.1f} MiB, of which remembered deliveries {remembered:.1f} MiB ({per_key:.0f} bytes each), "
        f"beyond them {beyond:+.1f} MiB"
    )
    results.add(
        "soak: requests, seconds",
        f"{memory['requests']:,.0f} in {memory['seconds']:.0f} s",
        value=memory["requests"],
    )
    results.add(
        "soak: gateway RSS start / settled / end",
        f"{memory['rss_start_mb']:.1f} / {memory['rss_settled_mb']:.1f} / {memory['rss_end_mb']:.1f} MiB",
        value=memory["rss_end_mb"],
        unit="MiB",
    )
    results.add(
        "soak: growth beyond remembered deliveries",
        f"{beyond:+.1f} MiB",
        f"<= {FLAT_TARGET_MB:.0f} MiB",
        meets(beyond <= FLAT_TARGET_MB),
        value=beyond,
        unit="MiB",
    )
    print(
        f"CPU per request gateway/bare {cpu_ratio:.2f}x (target <= {CPU_TARGET}x); requests/s gateway/bare {rate_ratio * 100:.0f} % (target >= {RATE_TARGET * 100:.0f} %)"
    )


def main(argv: list[str] | None = None) -> int:
    return run_on_fastest_loop(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
