"""Benchmark `python -m bench.callers [--rate 200] [--rounds 4] [--seconds 5]`: what caller authentication
and quotas cost a Register (docs/callers.md#quotas-per-caller).

Three `xmtp-push api` processes run side by side on one fresh migrated database and one Redis: one with
auth and quotas off, one with auth on and a caller sending an API key, one with auth on and a caller sending
an ES256 JWT (inline key), the two of them with all three quotas on (set high enough never to refuse, so
that every call pays their Redis scripts: the calls bucket, and the new-recipients bucket for each
Register, each creating a recipient). Each round sends Registers over gRPC at the rate, open loop (call i
due at t0 + i/rate, latency counted from then), to each server in turn; the rounds interleave the three,
so that the host's load falls on each alike. The goal: p99 with auth and quotas within 1.2x of off."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from redis import Redis

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from bench import _support as support
from bench._support import Results, verdict
from bench.registration import CALL_TIMEOUT_S, Calls, open_loop, register_request

REDIS_URL = "redis://127.0.0.1:6379/14"  # this benchmark's own database: flushed first
API_KEY = "bench-" + "k" * 40
GOAL = 1.2  # p99 with auth and quotas on, at most this times off's
WARMUP_CALLS = 200
QUOTAS = {
    "CALLER_CALLS_PER_MINUTE": "10000000",
    "CALLER_TOPIC_CHANGES_PER_MINUTE": "100000000",
    "NEW_RECIPIENTS_PER_MINUTE": "10000000",
}


@dataclass
class Setup:
    name: str
    settings: dict[str, str]
    metadata: tuple[tuple[str, str], ...] = ()
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    stub: Any = None


def setups() -> list[Setup]:
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    inline = json.dumps([{"kid": "bench", "alg": "ES256", "public_key": public.decode()}])
    token = jwt.encode(
        {"iss": "bench", "sub": "app", "exp": int(time.time()) + 3600}, key, "ES256", headers={"kid": "bench"}
    )
    auth = {"AUTH_ENABLED": "true", "AUTH_API_KEYS": json.dumps({"bench": API_KEY})}
    return [
        Setup("off", {}),
        Setup("API key + quotas", auth | QUOTAS, (("authorization", f"Bearer {API_KEY}"),)),
        Setup("JWT + quotas", auth | {"AUTH_KEYS": inline} | QUOTAS, (("authorization", f"Bearer {token}"),)),
    ]


async def round_of(setup: Setup, rate: float, calls: int) -> Calls:
    async def call(request: pb.RegisterRequest) -> None:
        await setup.stub.Register(request, metadata=setup.metadata, timeout=CALL_TIMEOUT_S)

    return await open_loop(rate, [register_request() for _ in range(calls)], call)


async def main_async(args: argparse.Namespace) -> int:
    print(f"{support.environment_line()}; load average {support.load_average()}")
    Redis.from_url(REDIS_URL).flushdb()
    results = Results(f"Register at {args.rate:g}/s over gRPC: auth and quotas on against off")
    runs = setups()
    async with support.bench_database() as url:
        servers: list[support.Proc] = []
        try:
            for setup in runs:
                env = support.server_env(url, REDIS_URL=REDIS_URL, **setup.settings)
                name = f"api-{len(servers) + 1}"  # the command is the name's first word
                servers.append(await support.start_xmtp_push(name, env, support.SERVING))
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{s.match.group(2)}") for s in servers]
            for setup, channel in zip(runs, channels, strict=True):
                await channel.channel_ready()
                setup.stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]
                await round_of(setup, args.rate, WARMUP_CALLS)
            calls = int(args.rate * args.seconds)
            for number in range(args.rounds):
                for setup in runs if number % 2 == 0 else reversed(runs):
                    measured = await round_of(setup, args.rate, calls)
                    setup.latencies += measured.latencies
                    setup.errors += sum(measured.errors.values())
            for channel in channels:
                await channel.close(None)
        finally:
            for server in servers:
                await support.stop_process(server)
    print(f"load average after: {support.load_average()}")
    off_p99 = support.summarize_ms(runs[0].latencies)["p99"]
    for setup in runs:
        summary = support.summarize_ms(setup.latencies)
        print(f"{setup.name}: {support.format_ms(summary)}; errors {setup.errors}")
        results.add(f"Register p50, {setup.name}", f"{summary['p50']:.2f} ms")
        if setup is runs[0]:
            results.add(f"Register p99, {setup.name}", f"{summary['p99']:.2f} ms")
            continue
        ratio = summary["p99"] / off_p99
        ok = ratio <= GOAL and not setup.errors
        value = f"{summary['p99']:.2f} ms ({ratio:.2f}x off)"
        results.add(f"Register p99, {setup.name}", value, f"<= {GOAL}x off, no errors", verdict(ok))
    results.print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.callers", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0, help="Register calls per second (open loop)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each measuring every setup once")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per setup per round")
    sys.exit(asyncio.run(main_async(parser.parse_args())))
