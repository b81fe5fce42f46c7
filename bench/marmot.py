"""Benchmark (not a test): Marmot triggers through a local relay to the APNs and FCM fakes, against a bare
loop doing the same unwrapping and decryption in one process.

    python -m bench.marmot [--triggers N] [--tokens 1,10] [--json PATH]

One run:
1. starts a relay in this process (rust-nostr's LocalRelay through nostr-sdk, on loopback, its rate limit
   raised), the APNs and FCM fakes in processes of their own (as `python -m bench.channels` does), and
   `xmtp-push marmot` with both channels pointed at the fakes and every Marmot rate tier raised out of the
   way; it waits for /readyz;
2. for each tokens-per-trigger count T: makes N triggers gift-wrapped to the server, each holding T
   distinct tokens (APNs and FCM alternately), and
   - the *bare loop*: in this process, for each gift wrap, `unwrap_trigger`, `split_chunks` and
     `decrypt_token` of every chunk, one after another: what the server must do, and nothing else;
   - *ours*: publishes the N gift wraps to the relay over one websocket as fast as it takes them, and
     waits until the fakes have seen all N x T distinct pushes.
   A warm-up round first (connections, the FCM OAuth token), not counted.

Rates: triggers / (time of the last push at a fake - time the first gift wrap was sent), both clocks
CLOCK_MONOTONIC. Prints both rates and ours/bare (target >= 70 %).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nostr_sdk as nostr

from app.marmot import secp
from app.marmot.giftwrap import wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, decrypt_token, encrypt_token
from app.marmot.unwrap import split_chunks, unwrap_trigger
from bench._proc import load_average, process_cpu_seconds
from bench._processes import start_process, stop_process, xmtp_push_command
from bench._results import Results
from bench._results import verdict as meets
from bench._support import environment_line, run_on_fastest_loop, service_collector
from bench.channels import Fake, backend_settings, running_fake

RATIO_TARGET = 0.70
_SERVING = re.compile(r"Marmot server: \d+ relay\(s\), http=\S*:(\d+)")
RAISED = 1_000_000_000
STALL_SECONDS = 20.0


# --------------------------------------------------------------------------- what is sent


def make_triggers(
    key: ServerKey, count: int, tokens: int, round_tag: int, fcm_every: int = 2
) -> tuple[list[dict[str, Any]], int, int]:
    """`count` gift wraps of `tokens` distinct tokens each, every `fcm_every`-th token an FCM one (0:
    none); how many go to APNs and to FCM."""
    wraps, apns, fcm = [], 0, 0
    for number in range(count):
        chunks = []
        for index in range(tokens):
            serial = number * tokens + index
            if not fcm_every or serial % fcm_every:
                chunks.append(encrypt_token(key.public_x, Platform.APNS, f"{round_tag:02x}{serial:062x}"))
                apns += 1
            else:
                chunks.append(encrypt_token(key.public_x, Platform.FCM, f"ok.{round_tag}.{serial}"))
                fcm += 1
        wraps.append(wrap_trigger(b"".join(chunks), key.public_x))
    return wraps, apns, fcm


# --------------------------------------------------------------------------- the bare loop


def bare_loop(key: ServerKey, wraps: list[dict[str, Any]]) -> tuple[float, int]:
    """Unwrap and decrypt every trigger in turn: (seconds, tokens decrypted)."""
    decrypted = 0
    started = time.perf_counter()
    for wrap in wraps:
        for chunk in split_chunks(unwrap_trigger(wrap, key)):
            decrypt_token(key.secret, chunk)
            decrypted += 1
    return time.perf_counter() - started, decrypted


# --------------------------------------------------------------------------- ours


@contextlib.asynccontextmanager
async def running_relay() -> AsyncIterator[str]:
    relay = (
        nostr.LocalRelayBuilder()
        .addr("127.0.0.1")
        .rate_limit(nostr.RateLimit(max_reqs=1000, notes_per_minute=RAISED))
        .build()
    )
    await relay.run()
    try:
        yield str(await relay.url())
    finally:
        relay.shutdown()


def marmot_env(key: ServerKey, relay_url: str, apns: Fake, fcm: Fake) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_")}
    settings = [*backend_settings("apns", apns), *backend_settings("fcm", fcm)]
    env.update({f"XMTP_PUSH_{setting.split('=', 1)[0]}": setting.split("=", 1)[1] for setting in settings})
    env.update(
        {
            "XMTP_PUSH_MARMOT_SECRET_KEY": key.secret.hex(),
            "XMTP_PUSH_MARMOT_RELAYS": relay_url,
            "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
            "XMTP_PUSH_HTTP_PORT": "0",
            "XMTP_PUSH_LOG_LEVEL": "INFO",
        }
    )
    for tier in ("GLOBAL", "CHUNK", "DEVICE"):
        for period in ("MINUTE", "HOUR"):
            env[f"XMTP_PUSH_MARMOT_{tier}_PER_{period}"] = str(RAISED)
    return env


async def wait_ready(session: aiohttp.ClientSession, http_port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{http_port}/readyz") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError("xmtp-push marmot did not become ready")


async def publish(session: aiohttp.ClientSession, relay_url: str, wraps: list[dict[str, Any]]) -> int:
    """Send every gift wrap over one websocket, then read the relay's OKs; the time the first was sent."""
    async with session.ws_connect(relay_url, max_msg_size=0) as ws:
        started = time.monotonic_ns()
        for wrap in wraps:
            await ws.send_str(json.dumps(["EVENT", wrap]))
        accepted = 0
        while accepted < len(wraps):
            message = json.loads((await ws.receive(timeout=60)).data)
            if message[0] == "OK":
                if not message[2]:
                    raise RuntimeError(f"the relay refused a gift wrap: {message[3]}")
                accepted += 1
    return started


async def delivered(session: aiohttp.ClientSession, apns: Fake, fcm: Fake, want: tuple[int, int]) -> int:
    """Wait for both fakes; the time of the last push (0 when they stalled short)."""
    apns_stats, fcm_stats = await asyncio.gather(
        apns.wait_for(session, want[0], STALL_SECONDS), fcm.wait_for(session, want[1], STALL_SECONDS)
    )
    if apns_stats["unique"] < want[0] or fcm_stats["unique"] < want[1]:
        print(f"stalled: APNs {apns_stats['unique']}/{want[0]}, FCM {fcm_stats['unique']}/{want[1]}")
        return 0
    return max(int(apns_stats["last_ns"]), int(fcm_stats["last_ns"]))


async def ours(
    session: aiohttp.ClientSession,
    relay_url: str,
    fakes: tuple[Fake, Fake],
    batch: tuple[list[Any], int, int],
    server_pid: int,
) -> tuple[float, float]:
    """Triggers per second through the relay and the server (0 when not all pushes arrived), and the
    server's CPU seconds per trigger meanwhile."""
    apns, fcm = fakes
    wraps, apns_count, fcm_count = batch
    await apns.reset(session)
    await fcm.reset(session)
    pids = (server_pid, apns.proc.pid, fcm.proc.pid, os.getpid())
    cpu_before = [process_cpu_seconds(pid) for pid in pids]
    started = await publish(session, relay_url, wraps)
    last = await delivered(session, apns, fcm, (apns_count, fcm_count))
    spent = [process_cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
    seconds = (last - started) / 1e9 if last else float("nan")
    print(
        f"  CPU over {seconds:.2f} s: server {spent[0]:.2f} s, fake APNs {spent[1]:.2f} s, "
        f"fake FCM {spent[2]:.2f} s, relay and this process {spent[3]:.2f} s"
    )
    cpu = spent[0] / len(wraps)
    return (0.0 if last == 0 else len(wraps) / ((last - started) / 1e9)), cpu


# --------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace) -> int:
    print(environment_line(), f"load {load_average()}")
    key = ServerKey(secp.fresh_secret())
    results = Results(
        "marmot", "Marmot triggers through a relay to the fakes vs a bare unwrap-and-decrypt loop"
    )
    failures = 0
    async with (
        running_relay() as relay_url,
        running_fake("apns") as apns,
        running_fake("fcm") as fcm,
        aiohttp.ClientSession() as session,
    ):
        env = marmot_env(key, relay_url, apns, fcm)
        env.update(dict(setting.split("=", 1) for setting in args.env))
        server = await start_process("xmtp-push marmot", [*xmtp_push_command(), "marmot"], env, _SERVING)
        try:
            await wait_ready(session, int(server.match.group(1)))
            warm_up = make_triggers(key, 50, 2, 0)
            await ours(session, relay_url, (apns, fcm), warm_up, server.pid)
            for tokens in args.tokens:
                failures += await one_size(
                    args, key, session, relay_url, (apns, fcm), tokens, results, server.pid
                )
        finally:
            await stop_process(server)
    results.write(args.json)
    return 1 if failures else 0


async def one_size(
    args: argparse.Namespace,
    key: ServerKey,
    session: aiohttp.ClientSession,
    relay_url: str,
    fakes: tuple[Fake, Fake],
    tokens: int,
    results: Results,
    server_pid: int,
) -> int:
    batch = make_triggers(key, args.triggers, tokens, tokens, args.fcm_every)
    with service_collector():
        seconds, decrypted = bare_loop(key, batch[0])
    assert decrypted == args.triggers * tokens
    bare_rate = args.triggers / seconds
    our_rate, cpu = await ours(session, relay_url, fakes, batch, server_pid)
    ratio = our_rate / bare_rate
    print(
        f"{tokens} token(s) per trigger, {args.triggers} triggers: bare loop {bare_rate:,.0f} triggers/s "
        f"({1000 / bare_rate:.2f} ms CPU each), ours {our_rate:,.0f} triggers/s ({our_rate * tokens:,.0f} "
        f"pushes/s; the server's CPU {cpu * 1000:.2f} ms per trigger), ours/bare {ratio:.0%} "
        f"(target >= {RATIO_TARGET:.0%}: {meets(ratio >= RATIO_TARGET)}); load {load_average()}"
    )
    results.add(f"server CPU per trigger, {tokens} token(s)", f"{cpu * 1000:.2f} ms", value=cpu, unit="s")
    results.add(f"bare loop, {tokens} token(s)", f"{bare_rate:,.0f}", value=bare_rate, unit="triggers/s")
    results.add(f"ours, {tokens} token(s)", f"{our_rate:,.0f}", value=our_rate, unit="triggers/s")
    ok = ratio >= RATIO_TARGET
    results.add(
        f"ours/bare, {tokens} token(s)", f"{ratio:.0%}", f">= {RATIO_TARGET:.0%}", meets(ok), value=ratio
    )
    return 0 if our_rate else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.marmot", description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", type=int, default=1000, help="triggers per size (default 1000)")
    parser.add_argument(
        "--tokens",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 10],
        help="tokens per trigger, comma-separated (default 1,10)",
    )
    parser.add_argument(
        "--fcm-every",
        type=int,
        default=2,
        help="every Nth token is an FCM one, the rest APNs (0: none; default 2)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="XMTP_PUSH_NAME=VALUE", help="a setting for the server"
    )
    parser.add_argument("--json", help="also write the results as JSON to this path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_on_fastest_loop(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
