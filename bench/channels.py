"""APNs or FCM hints through the backend (`xmtp-push api` + a worker) vs the same sent by a bare loop of its
library (aioapns `APNs`, 4 connections, or firebase-admin `send_each_async`; `--concurrency` in flight), to
one fake in its own process. Rate = hints / (last request at the fake - first send). Target: ratio >= 70 %."""

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import ssl
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import firebase_admin
import grpc
from aioapns import APNs, NotificationRequest, PushType
from aioapns.connection import APNsTLSClientProtocol
from aiohttp import ClientSession, ClientTimeout
from firebase_admin import messaging as fcm
from redis import Redis

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from bench import _support as support
from bench._support import Proc, Results, start_process, stop_process, verdict
from bench.pipeline import Backend, CpuWindow, Ingestor, running_backend
from fakes import keys

BUNDLE_ID, KEY_ID, TEAM_ID, PROJECT_ID = "org.example.bench", "BENCHKEY01", "BENCHTEAM1", "bench-project"
TOPICS, RECIPIENTS, PER_TOPIC = 10, 1000, 100  # token ok.{k} is on topic k % TOPICS
WARM_TOPIC = b"\x00" * 17  # of the hints that open connections and fetch OAuth tokens before a measurement
REDIS_URL = "redis://127.0.0.1:6379/12"  # this benchmark's own database: flushed first
REGISTERING = 32  # registrations in flight
STALL_SECONDS, RATIO_TARGET = 30.0, 0.70  # stop waiting for the fake after 30 s without progress
_FAKE_READY = re.compile(r"fake (?:apns|fcm) listening on (\d+)(?: control (\d+) ca (\S+))?")
Sender = Callable[[str, bytes, int], Awaitable[bool]]  # sends (token, topic, sequence_id): delivered?


@dataclass
class Fake:
    proc: Proc
    send_port: int  # where notifications go
    control: str  # base URL of /stats and /reset
    ca_file: str | None = None

    async def stats(self, session: ClientSession) -> dict[str, Any]:
        async with session.get(self.control + "/stats") as response:
            return dict(await response.json())

    async def reset(self, session: ClientSession) -> None:
        async with session.post(self.control + "/reset") as response:
            response.raise_for_status()

    async def wait_for(self, session: ClientSession, unique: int, stall_seconds: float) -> dict[str, Any]:
        """Poll until `unique` distinct notifications arrived, or none new for stall_seconds."""
        seen, since = -1, time.monotonic()
        while (stats := await self.stats(session))["unique"] < unique:
            if stats["unique"] != seen:
                seen, since = stats["unique"], time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                break
            await asyncio.sleep(0.05)
        return stats


@contextlib.asynccontextmanager
async def running_fake(channel: str) -> AsyncIterator[Fake]:
    tls = ["--tls-dir", tempfile.mkdtemp(prefix="bench-fake-")] if channel == "apns" else []
    command = [sys.executable, "-m", f"fakes.fake_{channel}", *tls]
    proc = await start_process(f"fake-{channel}", command, {**os.environ}, _FAKE_READY)
    port, control, ca_file = proc.match.groups()  # the FCM fake answers /stats on its one port
    try:
        yield Fake(proc, int(port), f"http://127.0.0.1:{control or port}", ca_file)
    finally:
        await stop_process(proc)


def service_account(fake: Fake) -> str:
    return keys.service_account(token_uri=f"http://127.0.0.1:{fake.send_port}/token", project_id=PROJECT_ID)


def backend_settings(channel: str, fake: Fake) -> list[str]:
    if channel != "apns":
        account = f"FCM_SERVICE_ACCOUNT={service_account(fake)}"
        return [account, f"FCM_ENDPOINT=http://127.0.0.1:{fake.send_port}"]
    ids = f"APNS_KEY_ID={KEY_ID} APNS_TEAM_ID={TEAM_ID} APNS_BUNDLE_ID={BUNDLE_ID}".split()
    endpoint = [f"APNS_ENDPOINT=https://127.0.0.1:{fake.send_port}", f"APNS_CA_FILE={fake.ca_file}"]
    return [f"APNS_KEY={keys.apns_key_pem()}", *ids, *endpoint]


def bare_apns_client(fake: Fake) -> Any:
    """aioapns's own `APNs` client (4 connections, one attempt each), pointed at the fake."""
    tls = ssl.create_default_context(cafile=fake.ca_file)
    limits: dict[str, Any] = {"max_connections": 4, "max_connection_attempts": 1, "ssl_context": tls}
    client = APNs(key=keys.apns_key_pem(), key_id=KEY_ID, team_id=TEAM_ID, topic=BUNDLE_ID, **limits)
    # aioapns' host is a class attribute of its protocol: point a subclass at the fake.
    at_fake = {"APNS_SERVER": "127.0.0.1", "APNS_PORT": fake.send_port}
    client.pool.protocol_class = type("FakeApnsProtocol", (APNsTLSClientProtocol,), at_fake)
    return client


def bare_apns(fake: Fake) -> Sender:
    client = bare_apns_client(fake)

    async def send(token: str, topic: bytes, sequence_id: int) -> bool:
        encoded, kind = base64.b64encode(topic).decode(), PushType.BACKGROUND
        message = {"aps": {"content-available": 1}, "topic": encoded, "sequence_id": str(sequence_id)}
        request = NotificationRequest(token, message, priority=5, push_type=kind, collapse_key=encoded)
        return bool((await asyncio.wait_for(client.send_notification(request), 10)).is_successful)

    return send


def bare_fcm(fake: Fake) -> Sender:
    account = firebase_admin.credentials.Certificate(json.loads(service_account(fake)))
    app = firebase_admin.initialize_app(account, {"projectId": PROJECT_ID, "httpTimeout": 10}, name="bare")
    # The FCM URL is a constant of the library: point the app's messaging service at the fake.
    service = fcm._get_messaging_service(app)
    service._fcm_url = f"http://127.0.0.1:{fake.send_port}/v1/projects/{PROJECT_ID}/messages:send"

    async def send(token: str, topic: bytes, sequence_id: int) -> bool:
        data = {"topic": base64.b64encode(topic).decode(), "sequence_id": str(sequence_id)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Message.token
            aps = fcm.APNSPayload(aps=fcm.Aps(content_available=True))
            apns = fcm.APNSConfig(headers={"apns-priority": "5", "apns-push-type": "background"}, payload=aps)
            android = fcm.AndroidConfig(priority="high")
            message = fcm.Message(token=token, data=data, android=android, apns=apns)
        return bool((await fcm.send_each_async([message], dry_run=False, app=app)).success_count == 1)

    return send


async def drive(send: Sender, hints: Sequence[tuple[str, bytes, int]], concurrency: int) -> None:
    """Send every hint, `concurrency` in flight, a failed one up to 3 times in all (as the pipeline does)."""
    items = iter(hints)

    async def one() -> None:
        for hint in items:
            for _ in range(3):
                with contextlib.suppress(Exception):
                    if await send(*hint):
                        break

    await asyncio.gather(*(one() for _ in range(concurrency)))


@dataclass
class Run:
    args: argparse.Namespace
    session: ClientSession
    fake: Fake
    recipients: list[tuple[str, bytes]]  # (token, topic)
    envelopes: list[tuple[bytes, int]]  # (topic, sequence_id)
    plan: list[tuple[str, bytes, int]]  # every hint they make, in the order the bare loop sends them
    results: Results

    def record(self, label: str, stats: dict[str, Any], start_ns: int, cpu: CpuWindow, process: str) -> float:
        """Tabulate one side's hints / (the fake's last request - the first send) and CPU time per hint."""
        unique, planned, seconds = stats["unique"], len(self.plan), (stats["last_ns"] - start_ns) / 1e9
        rate = unique / seconds if seconds > 0 else 0.0
        us = {name: share * cpu.wall / max(1, unique) * 1e6 for name, share in cpu.result.items()}
        # Per hint, CPU time is steadier than rates when other load shares the host.
        print(f"{label}: {cpu.describe()}\n  per hint:", ", ".join(f"{n} {v:.0f} us" for n, v in us.items()))
        delivered = f"{rate:,.0f} ({unique:,} of {planned:,} delivered in {seconds:.2f} s)"
        self.results.add(f"{label}: hints/s", delivered, "all delivered", verdict(unique >= planned))
        self.results.add(f"{label}: CPU per hint, {process} process", f"{us[process]:.0f} us")
        return rate


async def run_bare(run: Run) -> float:
    concurrency, apns = run.args.concurrency, run.args.channel == "apns"
    with support.service_collector():  # the backend's garbage-collector settings
        send = bare_apns(run.fake) if apns else bare_fcm(run.fake)
        await drive(send, [(f"ok.warm{i}", WARM_TOPIC, i) for i in range(min(50, concurrency))], concurrency)
        await run.fake.reset(run.session)
        cpu, started = CpuWindow({"fake": run.fake.proc.pid}), time.monotonic_ns()
        await drive(send, run.plan, concurrency)
        stats = await run.fake.wait_for(run.session, len(run.plan), STALL_SECONDS)
        cpu.stop()
    return run.record("bare loop", stats, started, cpu, "bench")


async def register(grpc_port: int, channel: str, tokens: Sequence[tuple[str, bytes]]) -> None:
    """A recipient of the channel per (token, topic), registered and subscribed over gRPC, REGISTERING at
    a time (the server refuses streams beyond 100 on a connection: docs/callers.md)."""
    work = iter(tokens)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as connection:
        stub = notification_pb2_grpc.NotificationServiceStub(connection)  # type: ignore[no-untyped-call]

        async def one() -> None:
            for token, topic in work:
                ids: dict[str, Any] = {
                    k: secrets.token_bytes(32) for k in ("recipient_id", "recipient_secret")
                }
                await stub.Register(pb.RegisterRequest(**ids | {channel: {"token": token}}), timeout=30)
                adds = [pb.Subscription(topic=topic)]
                await stub.UpdateSubscriptions(pb.UpdateSubscriptionsRequest(**ids, adds=adds), timeout=30)

        await asyncio.gather(*(one() for _ in range(REGISTERING)))


Enroll = Callable[[Backend, str, Sequence[tuple[str, bytes]]], Awaitable[None]]  # (backend, channel, tokens)


async def register_recipients(backend: Backend, channel: str, tokens: Sequence[tuple[str, bytes]]) -> None:
    await register(backend.grpc_port, channel, tokens)


async def run_pipeline(
    run: Run, label: str = "pipeline", enroll: Enroll = register_recipients, env: Sequence[str] = ()
) -> float:
    """The plan's hints through `xmtp-push api` and one worker, its tokens enrolled by `enroll` (the new
    API's recipients by default), with `env` beside the channel's settings: hints/s."""
    Redis.from_url(REDIS_URL).flushdb()
    settings = [*backend_settings(run.args.channel, run.fake), *env, *run.args.env]
    options = argparse.Namespace(mode="redis", workers=1, env=settings)
    async with support.bench_database() as url, running_backend(options, url, REDIS_URL) as backend:
        await enroll(backend, run.args.channel, [*run.recipients, ("ok.warm", WARM_TOPIC)])
        ingest = Ingestor(run.session, backend.http_port)
        await ingest.closed_loop([(WARM_TOPIC, 1)], 1, 1)
        await run.fake.wait_for(run.session, 1, STALL_SECONDS)
        await run.fake.reset(run.session)
        cpu = CpuWindow({p.name.split("-")[0]: p.pid for p in backend.procs} | {"fake": run.fake.proc.pid})
        log = await ingest.closed_loop(run.envelopes, 10, 2)
        stats = await run.fake.wait_for(run.session, len(run.plan), STALL_SECONDS)
        cpu.stop()
    duplicates = stats["count"] - stats["unique"]
    print(f"{label}: {len(run.envelopes):,} envelopes, {duplicates} duplicates, errors {dict(log.errors)}")
    run.results.add(f"{label}: duplicates", str(duplicates), "0", verdict(duplicates == 0))
    return run.record(label, stats, log.first_sent, cpu, "worker")


async def amain(args: argparse.Namespace) -> int:
    print(f"{support.environment_line()}\nhost load average:", *(f"{x:.2f}" for x in os.getloadavg()))
    topics = [b"\x00" + secrets.token_bytes(16) for _ in range(TOPICS)]
    recipients = [(f"ok.{k}", topics[k % TOPICS]) for k in range(RECIPIENTS)]
    envelopes = [(topics[i % TOPICS], 1000 + i) for i in range(-(-args.hints // PER_TOPIC))]
    plan = [(token, topic, seq) for topic, seq in envelopes for token, on in recipients if on == topic]
    results = Results(f"{args.channel} hints, pipeline ({' '.join(args.env) or 'defaults'}) vs bare loop")
    async with ClientSession(timeout=ClientTimeout(total=60)) as session, running_fake(args.channel) as fake:
        run = Run(args, session, fake, recipients, envelopes, plan, results)
        bare = await run_bare(run)
        await fake.reset(session)  # so that the pipeline's warm-up waits for its own hint
        ours = await run_pipeline(run)
    ratio, target = ours / bare if bare else 0.0, f">= {RATIO_TARGET * 100:.0f} %"
    results.add("ratio pipeline/bare", f"{ratio * 100:.0f} %", target, verdict(ratio >= RATIO_TARGET))
    results.print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser("python -m bench.channels", description=__doc__)
    parser.add_argument("--channel", choices=["apns", "fcm"], required=True)
    parser.add_argument("--hints", type=int, default=20_000, help="hints to deliver")
    parser.add_argument("--concurrency", type=int, default=256, help="bare loop in flight (ours: 256)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="backend setting")
    sys.exit(support.run_on_fastest_loop(amain(parser.parse_args())))
