"""Benchmark: the Matrix push gateway (`xmtp-push gateway`) against a bare aioapns loop (its `APNs` client,
4 connections): same notify bodies and tokens, same APNs fake. Rate: requests / (last arrival - first send);
CPU per request: the measured process's own CPU / N. The soak reads the gateway's RSS every second; its
verdict is on the growth after the first fifth beyond the deliveries remembered (ten minutes, by design)."""

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aioapns.common import NotificationRequest, PushType
from redis.asyncio import Redis

from app.matrix.apns_app import ApnsOptions, render_push
from app.matrix.duplicates import ProcessMemory, delivery_key
from app.matrix.notification import parse_notification
from bench import _support as support
from bench._support import Proc, Results, format_ms, process_cpu_seconds, rss_mb, summarize_ms, verdict
from bench.channels import BUNDLE_ID, KEY_ID, TEAM_ID, Fake, bare_apns_client, running_fake
from fakes import keys

APP_ID, HOST = "org.example.bench.ios", "bench.example.org"
DEVICE = {"app_id": APP_ID, "pushkey": "", "pushkey_ts": 1_700_000_000, "data": {"format": "event_id_only"}}
CPU_TARGET, RATE_TARGET, GROWTH_MB = 1.1, 0.7, 5.0  # gateway/bare CPU, gateway/bare rate, soak growth
_GATEWAY_READY = re.compile(r"serving the Matrix push gateway on (?:HTTP port )?(?:[^\s:]+:)?(\d+)")
# A notify request, the hex device token APNs gets, and the APNs body the gateway renders.
Notify = tuple[bytes, str, dict[str, object]]
Send = Callable[[Notify], Awaitable[bool]]
Sample = tuple[float, float, int]  # soak: (seconds, gateway RSS MiB, requests so far)


def notifications(count: int, salt: str) -> list[Notify]:
    """One-device notify requests (base64 pushkeys as iOS clients send; unique event ids), rendered."""
    options, made = ApnsOptions(push_type=None, convert_device_token_to_hex=True), []
    for n in range(count):
        device = DEVICE | {"pushkey": base64.b64encode(secrets.token_bytes(32)).decode()}
        event: dict[str, object] = {"event_id": f"${salt}{n}:{HOST}", "room_id": f"!room{n % 500}:{HOST}"}
        event |= {"counts": {"unread": 1 + n % 9}, "prio": "high", "devices": [device]}
        body = json.dumps({"notification": event}).encode()
        parsed = parse_notification(body)
        push = render_push(options, parsed, parsed.devices[0])
        assert push is not None and isinstance(push.payload, bytes)
        made.append((body, push.address, json.loads(push.payload)))
    return made


@dataclass
class Load:
    fake: Fake
    control: aiohttp.ClientSession  # to the fake's /stats and /reset
    plan: list[Notify]  # the timed requests
    concurrency: int  # requests in flight
    results: Results
    all_arrived: bool = True

    async def drive(self, send: Send, work: list[Notify]) -> tuple[int, list[float]]:
        """Send every item; how many were answered as delivered, and each one's latency."""
        items, ok, latencies = iter(work), 0, list[float]()

        async def one() -> None:
            nonlocal ok
            for item in items:
                started = time.perf_counter()
                try:
                    delivered = bool(await send(item))  # before `ok +=`: that reads ok before awaiting
                    ok += delivered
                except Exception as error:  # counted as not delivered; the first few said
                    if ok < 3:
                        print(f"  send failed: {type(error).__name__}: {error}", file=sys.stderr)
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(one() for _ in range(self.concurrency)))
        return ok, latencies

    async def timed(self, label: str, send: Send, pid: int) -> tuple[float, float]:
        """The plan, timed, `pid`'s CPU measured; its rows added; (requests/s, CPU us per request)."""
        sent, cpu, driver = len(self.plan), process_cpu_seconds(pid), process_cpu_seconds(os.getpid())
        started = time.monotonic_ns()  # the fake stamps arrivals with CLOCK_MONOTONIC too
        ok, latencies = await self.drive(send, self.plan)
        cpu = (process_cpu_seconds(pid) - cpu) * 1e6 / sent
        driver = (process_cpu_seconds(os.getpid()) - driver) * 1e6 / sent
        stats = await self.fake.wait_for(self.control, sent, 30.0)
        seconds, arrived = (stats["last_ns"] - started) / 1e9, stats["unique"]
        rate, latency = arrived / seconds if seconds > 0 else 0.0, summarize_ms(latencies)
        print(f"{label}: {ok:,} answered ok in {seconds:.2f} s; latency {format_ms(latency)}")
        self.all_arrived &= (complete := arrived == sent)
        self.results.add(f"{label}: at the fake / sent", f"{arrived:,} / {sent:,}", "all", verdict(complete))
        self.results.add(f"{label}: requests/s", f"{rate:,.0f}")
        self.results.add(f"{label}: CPU per request (load driver)", f"{cpu:.0f} us ({driver:.0f} us)")
        self.results.add(f"{label}: latency p50 / p99", f"{latency['p50']:.2f} / {latency['p99']:.2f} ms")
        return rate, cpu

    async def bare(self) -> tuple[float, float]:
        """aioapns's own client sends the plan's bodies to its tokens; its CPU is this process's."""
        client = bare_apns_client(self.fake)

        async def send(item: Notify) -> bool:
            request = NotificationRequest(item[1], item[2], priority=10, push_type=PushType.ALERT)
            return bool((await asyncio.wait_for(client.send_notification(request), 10)).is_successful)

        try:
            await self.drive(send, self.plan[:200])  # connections and the JWT
            await self.fake.reset(self.control)
            with support.service_collector():
                return await self.timed("bare loop", send, os.getpid())
        finally:
            client.pool.close()

    async def gateway(self, gateway: Proc, seconds: float) -> tuple[tuple[float, float], list[Sample]]:
        """Notify requests over keep-alive HTTP/1.1 (delivered: 200 `{"rejected":[]}`), then the soak."""
        url = f"http://127.0.0.1:{gateway.match.group(1)}/_matrix/push/v1/notify"
        headers = {"content-type": "application/json"}
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as client:

            async def send(item: Notify) -> bool:
                async with client.post(url, data=item[0], headers=headers) as response:
                    answer = await response.read()
                    return response.status == 200 and answer == b'{"rejected":[]}'

            await self.drive(send, notifications(min(500, len(self.plan)), "warm"))
            await self.fake.reset(self.control)
            return await self.timed("gateway", send, gateway.pid), await self.soak(send, gateway.pid, seconds)

    async def soak(self, send: Send, pid: int, seconds: float) -> list[Sample]:
        """The same load for `seconds`, the gateway's RSS read about every second."""
        salt, samples, rounds = secrets.token_hex(4), list[Sample](), 0
        batch, started = notifications(2000, salt), time.monotonic()
        while time.monotonic() < started + seconds:
            rounds += 1  # new event ids each round: a repeat would be answered from memory without a push
            fresh = f"{salt}r{rounds}x".encode()
            work = [(body.replace(salt.encode(), fresh), token, payload) for body, token, payload in batch]
            await self.drive(send, work)
            if time.monotonic() >= started + len(samples):  # sample k at k seconds or after
                samples.append((time.monotonic() - started, rss_mb(pid), rounds * len(batch)))
        return [*samples, (time.monotonic() - started, rss_mb(pid), rounds * len(batch))]


def gateway_env(fake: Fake, folder: str, redis_url: str | None) -> dict[str, str]:
    """The gateway's settings: an apps file with one APNs app at the fake; Redis for duplicates if given."""
    key_file, apps = Path(folder, "apns.p8"), Path(folder, "sygnal.yaml")
    key_file.write_text(keys.apns_key_pem())
    app = {"type": "apns", "keyfile": key_file, "key_id": KEY_ID, "team_id": TEAM_ID, "topic": BUNDLE_ID}
    app |= {"endpoint": f"https://127.0.0.1:{fake.send_port}", "ca_file": fake.ca_file}
    apps.write_text(f"apps:\n  {APP_ID}:\n" + "".join(f"    {k}: {v}\n" for k, v in app.items()))
    settings = {"MATRIX_APPS": str(apps), "HTTP_HOST": "127.0.0.1", "HTTP_PORT": "0", "REDIS_URL": redis_url}
    return support.xmtp_push_env({name: value for name, value in settings.items() if value})


async def key_bytes(count: int = 100_000) -> float:
    """What one remembered delivery costs the gateway's memory, in bytes (nothing when Redis remembers)."""
    memory = ProcessMemory()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(count):
        await memory.remember(delivery_key(APP_ID, f"pushkey{n}", f"$event{n}"))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / count


def record_soak(results: Results, samples: list[Sample], per_key: float) -> None:
    (_, start_mb, _), (seconds, end_mb, sent) = samples[0], samples[-1]
    _, settled_mb, settled_sent = samples[max(0, len(samples) // 5 - 1)]  # after the first fifth
    remembered = (sent - settled_sent) * per_key / 2**20
    other = end_mb - settled_mb - remembered
    results.add("soak: requests, seconds", f"{sent:,} in {seconds:.0f} s")
    results.add("soak: RSS start / 1st fifth / end", f"{start_mb:.1f} / {settled_mb:.1f} / {end_mb:.1f} MiB")
    results.add("soak: growth by remembered deliveries", f"{remembered:.1f} MiB ({per_key:.0f} bytes each)")
    results.add("soak: other growth", f"{other:+.1f} MiB", f"<= {GROWTH_MB} MiB", verdict(other <= GROWTH_MB))


async def amain(args: argparse.Namespace) -> int:
    print(f"{support.environment_line()}; load average at start {support.load_average()}")
    plan = notifications(args.requests, secrets.token_hex(4))
    print(f"{args.requests:,} one-device event_id_only notifications, {args.concurrency} in flight")
    if args.redis_url:
        async with Redis.from_url(args.redis_url) as redis:
            await redis.flushdb()
        print(f"duplicate memory in Redis: {args.redis_url} (FLUSHDB done)")
    async with running_fake("apns") as fake, aiohttp.ClientSession() as control:
        load = Load(fake, control, plan, args.concurrency, Results("Matrix gateway vs a bare aioapns loop"))
        bare_rate, bare_cpu = await load.bare()
        with tempfile.TemporaryDirectory(prefix="bench-matrix-") as folder:
            env = gateway_env(fake, folder, args.redis_url)
            gateway = await support.start_xmtp_push("gateway", env, _GATEWAY_READY)
            try:
                (rate, cpu), samples = await load.gateway(gateway, args.duration)
            finally:
                await support.stop_process(gateway)
    cpu, rate = cpu / bare_cpu, rate / bare_rate
    cpu_ok, rate_ok = verdict(cpu <= CPU_TARGET), verdict(rate >= RATE_TARGET)
    load.results.add("CPU per request gateway/bare", f"{cpu:.2f}x", f"<= {CPU_TARGET}x", cpu_ok)
    load.results.add("requests/s gateway/bare", f"{rate:.0%}", f">= {RATE_TARGET:.0%}", rate_ok)
    record_soak(load.results, samples, 0.0 if args.redis_url else await key_bytes())
    load.results.print()
    return 0 if load.all_arrived else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.matrix", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000, help="notify requests per timed run (N)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (C)")
    parser.add_argument("--duration", type=float, default=20.0, help="soak seconds (300: five minutes)")
    parser.add_argument("--redis-url", help="keep the duplicate memory in this Redis (FLUSHDB first)")
    sys.exit(support.run_on_fastest_loop(amain(parser.parse_args())))
