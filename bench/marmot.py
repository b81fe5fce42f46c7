"""Benchmark (not a test): Marmot triggers through a local relay to the APNs and FCM fakes, against two
bare loops in one process: one doing the same unwrapping and decryption, one doing that and the same
sends to the same APNs fake through aioapns's own client.

    python -m bench.marmot [--triggers N] [--tokens 1,10] [--rounds R] [--fcm-every N] [--json PATH]
    python -m bench marmot [options]   (and the report's marmot section is updated alone)

One run:
1. starts a relay in this process (rust-nostr's LocalRelay through nostr-sdk, on loopback, its rate limit
   raised), the APNs and FCM fakes in processes of their own (as `python -m bench.channels` does), and
   `xmtp-push marmot` with both channels pointed at the fakes and every Marmot rate tier (and the pending
   buffer) raised out of the way; it waits for /readyz;
2. for each tokens-per-trigger count T: makes N triggers gift-wrapped to the server, each holding T
   distinct tokens (APNs only by default; with --fcm-every K every Kth token is an FCM one), and
   - *bare unwrap+decrypt*: in this process, for each gift wrap, `unwrap_trigger`, `split_chunks` and
     `decrypt_token` of every chunk, one after another: what the server must do before sending;
   - *bare unwrap+decrypt+send* (APNs only): the same, and each token's silent push sent to the APNs
     fake by aioapns's `APNs` client (4 connections), 64 triggers at once, a trigger's tokens together
     (as the Matrix benchmark's bare loop is a bare aioapns loop);
   - *the delivery core's pushes* (APNs only): the same tokens' silent pushes, rendered as the
     server renders them, sent by the server's own APNs provider in this process, 64 at once: its
     CPU per push, so that the server's CPU per trigger less its pushes (what its Marmot path spends:
     relay, admission, unwrapping, decryption) can be set against the bare unwrap+decrypt loop;
   - *ours*: publishes the N gift wraps to the relay over one websocket as fast as it takes them, and
     waits until the fakes have seen all N x T distinct pushes.
   A warm-up round first (connections, the FCM OAuth token), not counted. Each size runs R rounds
   (default 3), each on fresh triggers, and their medians are compared: on a shared 2-core host one
   round's ratios move by tens of percent.

Rates: triggers / (time of the last push at a fake - time the first gift wrap was sent), both clocks
CLOCK_MONOTONIC (the bare unwrap+decrypt loop: its own wall time). CPU per trigger: the server process's
CPU seconds over its window / N (the relay, the fakes and this process are not counted); the bare loops'
own: this thread's CPU (unwrap+decrypt), this process's (with sends). The host is shared by the server,
the relay and the fakes, and on a small or busy host the rates say more about the scheduler than about
the server: each ratio is printed by rate and by CPU per trigger, target >= 70 % for both. Last, what
the target rate would take at the measured costs: the server's CPU per trigger times that rate (over
1 core, one process cannot reach it) and the whole run's (server, fakes, relay, publisher; over the
host's cores, nothing on this host can).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import aiohttp
import nostr_sdk as nostr

from app.delivery.credentials import ApnsCredentials
from app.delivery.providers.apns import ApnsProvider
from app.delivery.types import OutcomeKind, Push
from app.marmot import secp
from app.marmot.dispatch import render
from app.marmot.giftwrap import wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, decrypt_token, encrypt_token
from app.marmot.unwrap import split_chunks, unwrap_trigger
from app.testing import keys
from bench._proc import load_average, process_cpu_seconds
from bench._processes import start_process, stop_process, xmtp_push_command
from bench._results import Results
from bench._results import verdict as meets
from bench._support import environment_line, run_on_fastest_loop, service_collector
from bench.channels import BUNDLE_ID, KEY_ID, TEAM_ID, Fake, backend_settings, bare_apns_client, running_fake

RATIO_TARGET = 0.70
_SERVING = re.compile(r"Marmot server: \d+ relay\(s\), http=\S*:(\d+)")
RAISED = 1_000_000_000
STALL_SECONDS = 20.0
SILENT = {"aps": {"content-available": 1}}  # the body the server sends (app/marmot/dispatch.py)
Batch = tuple[list[dict[str, Any]], int, int]  # gift wraps, APNs tokens, FCM tokens


class Measured(NamedTuple):
    rate: float  # triggers/s, wall
    cpu: float  # CPU seconds per trigger of the process doing the work


class Ends(NamedTuple):
    """What a round sends through and measures: the relay, the fakes and the server."""

    session: aiohttp.ClientSession
    relay_url: str
    fakes: tuple[Fake, Fake]
    server_pid: int


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


def bare_loop(key: ServerKey, wraps: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Unwrap and decrypt every trigger in turn: (wall seconds, this thread's CPU seconds, tokens
    decrypted)."""
    decrypted = 0
    started, cpu_started = time.perf_counter(), time.thread_time()
    for wrap in wraps:
        for chunk in split_chunks(unwrap_trigger(wrap, key)):
            decrypt_token(key.secret, chunk)
            decrypted += 1
    return time.perf_counter() - started, time.thread_time() - cpu_started, decrypted


async def bare_sends(
    key: ServerKey, session: aiohttp.ClientSession, fake: Fake, batch: Batch, concurrency: int
) -> tuple[float, float]:
    """The same unwrapping and decryption, and each token's silent push sent to the same APNs fake by
    aioapns's own client (4 connections, as the server's provider), `concurrency` triggers at once (as
    MARMOT_MAX_CONCURRENT), a trigger's tokens sent together: (triggers/s, this process's CPU seconds
    per trigger); the rate is 0 when not every push arrived."""
    wraps, apns_count, _ = batch
    client = bare_apns_client(fake)
    try:
        await _bare_round(key, client, make_triggers(key, 50, 2, 0xFF, 0)[0], concurrency)
        await fake.reset(session)
        cpu_before = process_cpu_seconds(os.getpid())
        started = time.monotonic_ns()
        with service_collector():
            await _bare_round(key, client, wraps, concurrency)
        stats = await fake.wait_for(session, apns_count, STALL_SECONDS)
        cpu = (process_cpu_seconds(os.getpid()) - cpu_before) / len(wraps)
    finally:
        client.pool.close()
    if stats["unique"] < apns_count:
        print(f"bare sends stalled: APNs {stats['unique']}/{apns_count}")
        return 0.0, cpu
    return len(wraps) / ((int(stats["last_ns"]) - started) / 1e9), cpu


async def _bare_round(key: ServerKey, client: Any, wraps: list[dict[str, Any]], concurrency: int) -> None:
    from aioapns.common import NotificationRequest, PushType

    async def send(token: str) -> None:
        request = NotificationRequest(
            device_token=token, message=SILENT, priority=5, push_type=PushType.BACKGROUND
        )
        result = await asyncio.wait_for(client.send_notification(request), 10)
        if not result.is_successful:
            raise RuntimeError("the APNs fake refused a bare push")

    async def worker(queue: Iterator[dict[str, Any]]) -> None:
        for wrap in queue:
            tokens = [decrypt_token(key.secret, c).token for c in split_chunks(unwrap_trigger(wrap, key))]
            await asyncio.gather(*(send(token) for token in tokens))

    queue = iter(wraps)
    await asyncio.gather(*(worker(queue) for _ in range(concurrency)))


async def core_sends(key: ServerKey, fake: Fake, batch: Batch, concurrency: int) -> float:
    """CPU seconds per push of the delivery core's own APNs provider (what the server sends
    through), in this process: the batch's pushes rendered as the server renders them, `concurrency`
    at once, nothing else. The server's CPU less its pushes at this cost is what its Marmot path
    itself spends."""
    pushes = [
        render(decrypt_token(key.secret, chunk))
        for wrap in batch[0]
        for chunk in split_chunks(unwrap_trigger(wrap, key))
    ]
    credentials = ApnsCredentials(
        keys.apns_key_pem(), KEY_ID, TEAM_ID, BUNDLE_ID, f"https://127.0.0.1:{fake.send_port}", fake.ca_file
    )
    provider = ApnsProvider(credentials, 10.0)
    try:
        await _core_round(provider, pushes[:100], concurrency)  # connections and the JWT
        cpu_before = process_cpu_seconds(os.getpid())
        with service_collector():
            delivered = await _core_round(provider, pushes, concurrency)
        cpu = process_cpu_seconds(os.getpid()) - cpu_before
    finally:
        await provider.close()
    if delivered < len(pushes):
        raise RuntimeError(f"the delivery core delivered {delivered} of {len(pushes)} pushes")
    return cpu / len(pushes)


async def _core_round(provider: ApnsProvider, pushes: list[Push], concurrency: int) -> int:
    work = iter(pushes)
    delivered = 0

    async def worker() -> None:
        nonlocal delivered
        for push in work:
            outcome = await provider.send(push)
            delivered += outcome.kind is OutcomeKind.DELIVERED

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return delivered


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
    env["XMTP_PUSH_MARMOT_PENDING_BYTES"] = str(RAISED)  # a burst larger than the default buffer
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
    elapsed = (time.monotonic_ns() - started) / 1e9
    print(f"  the relay took all {len(wraps)} gift wraps in {elapsed:.2f} s")
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
) -> tuple[Measured, float]:
    """Triggers per second through the relay and the server (0 when not all pushes arrived) and the
    server's CPU seconds per trigger meanwhile; and the CPU seconds per trigger of everything the run
    took: the server, the fakes, the relay and the publisher (this process)."""
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
    if not last:  # not every trigger's work was done: no rate, no CPU per trigger
        return Measured(0.0, math.nan), math.nan
    return Measured(len(wraps) / seconds, spent[0] / len(wraps)), sum(spent) / len(wraps)


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
            ends = Ends(session, relay_url, (apns, fcm), server.pid)
            for tokens in args.tokens:
                failures += await one_size(args, key, ends, tokens, results)
        finally:
            await stop_process(server)
    results.write(args.json)
    return 1 if failures else 0


class Round(NamedTuple):
    bare: Measured  # unwrap+decrypt
    sends: Measured | None  # unwrap+decrypt+send (APNs-only batches)
    push_cpu: float | None  # the delivery core's CPU seconds per push (APNs-only batches)
    ours: Measured
    run_cpu: float  # CPU seconds per trigger of the server, the fakes, the relay and the publisher


async def one_round(args: argparse.Namespace, key: ServerKey, ends: Ends, tokens: int, number: int) -> Round:
    """Every measure once, on a fresh batch of triggers."""
    batch = make_triggers(key, args.triggers, tokens, (tokens * 16 + number) % 256, args.fcm_every)
    with service_collector():
        seconds, bare_cpu, decrypted = bare_loop(key, batch[0])
    assert decrypted == args.triggers * tokens
    sends, push_cpu = None, None
    if batch[2] == 0:
        sends = Measured(*await bare_sends(key, ends.session, ends.fakes[0], batch, args.concurrency))
        push_cpu = await core_sends(key, ends.fakes[0], batch, args.concurrency)
    server, run_cpu = await ours(ends.session, ends.relay_url, ends.fakes, batch, ends.server_pid)
    return Round(
        Measured(args.triggers / seconds, bare_cpu / args.triggers), sends, push_cpu, server, run_cpu
    )


async def one_size(
    args: argparse.Namespace, key: ServerKey, ends: Ends, tokens: int, results: Results
) -> int:
    """`args.rounds` rounds at `tokens` tokens per trigger; their medians compared and recorded."""
    rounds = [await one_round(args, key, ends, tokens, number) for number in range(args.rounds)]
    if any(not round_.ours.rate for round_ in rounds):
        return 1
    typical = _medians(rounds)
    print(
        f"{tokens} token(s) per trigger, {args.triggers} triggers, median of {len(rounds)} round(s); load {load_average()}"
    )
    _print_spread(rounds)
    compare(results, tokens, "bare unwrap+decrypt", typical.bare, typical.ours)
    if typical.sends is None or typical.push_cpu is None:
        print("  bare unwrap+decrypt+send: not run (it sends to APNs only: use --fcm-every 0)")
    else:
        compare(results, tokens, "bare unwrap+decrypt+send", typical.sends, typical.ours)
        pushes_aside(results, tokens, typical.bare, typical.ours, typical.push_cpu)
    cores_needed(results, tokens, typical)
    return 0


def _medians(rounds: list[Round]) -> Round:
    sends = [round_.sends for round_ in rounds if round_.sends is not None]
    push_cpu = [round_.push_cpu for round_ in rounds if round_.push_cpu is not None]
    return Round(
        _median([round_.bare for round_ in rounds]),
        _median(sends) if sends else None,
        statistics.median(push_cpu) if push_cpu else None,
        _median([round_.ours for round_ in rounds]),
        statistics.median(round_.run_cpu for round_ in rounds),
    )


def _median(measures: list[Measured]) -> Measured:
    """The median rate and the median CPU per trigger (not necessarily of the same round)."""
    return Measured(statistics.median(m.rate for m in measures), statistics.median(m.cpu for m in measures))


def _print_spread(rounds: list[Round]) -> None:
    for number, round_ in enumerate(rounds, 1):
        print(
            f"  round {number}: bare unwrap+decrypt {round_.bare.rate:,.0f}/s {round_.bare.cpu * 1000:.2f} ms; "
            f"ours {round_.ours.rate:,.0f}/s {round_.ours.cpu * 1000:.2f} ms; everything in the run "
            f"{round_.run_cpu * 1000:.2f} ms CPU per trigger"
        )


def cores_needed(results: Results, tokens: int, typical: Round) -> None:
    """What the target rate would take on this host: the server's CPU per trigger and the whole run's,
    each times the rate. Past 1 core the server cannot reach it as one process; past the host's cores
    nothing can."""
    rate = RATIO_TARGET * typical.bare.rate
    server, everything, cores = typical.ours.cpu * rate, typical.run_cpu * rate, os.cpu_count() or 1
    display = (
        f"server {server:.2f} cores (one process: at most {1 / typical.ours.cpu:,.0f} triggers/s); "
        f"server, fakes, relay and publisher {everything:.2f} cores; this host has {cores}"
    )
    print(f"  CPU the target rate ({rate:,.0f} triggers/s) takes at these costs: {display}")
    results.add(
        f"CPU the target rate takes at these costs, {tokens} token(s)",
        display,
        value=everything,
        unit="cores",
    )


def pushes_aside(results: Results, tokens: int, bare: Measured, server: Measured, push_cpu: float) -> None:
    """The server's CPU per trigger less its pushes at the delivery core's own cost per push, against
    the bare unwrap+decrypt loop: what the Marmot path (relay, admission, unwrapping, decryption)
    costs beside the bare crypto."""
    own = server.cpu - tokens * push_cpu
    ratio = bare.cpu / own
    label = f"{tokens} token(s)"
    print(
        f"  the delivery core's CPU per push {push_cpu * 1e6:.0f} us; the server's CPU per trigger less "
        f"its {tokens} push(es): {own * 1000:.2f} ms; bare unwrap+decrypt/that {ratio:.0%} "
        f"({meets(ratio >= RATIO_TARGET)}; target >= {RATIO_TARGET:.0%})"
    )
    results.add(f"delivery core CPU per push, {label}", f"{push_cpu * 1e6:.0f} us", value=push_cpu, unit="s")
    results.add(
        f"server CPU per trigger less its pushes, {label}", f"{own * 1000:.2f} ms", value=own, unit="s"
    )
    results.add(
        f"ours/bare unwrap+decrypt by CPU, pushes aside, {label}",
        f"{ratio:.0%}",
        f">= {RATIO_TARGET:.0%}",
        meets(ratio >= RATIO_TARGET),
        value=ratio,
    )


def compare(results: Results, tokens: int, name: str, bare: Measured, server: Measured) -> None:
    """Print and record one bare loop against the server: rates and CPU per trigger, both as ratios."""
    rate_ratio, cpu_ratio = server.rate / bare.rate, bare.cpu / server.cpu
    print(
        f"  {name}: {bare.rate:,.0f} triggers/s, {bare.cpu * 1000:.2f} ms CPU each; ours "
        f"{server.rate:,.0f} triggers/s ({server.rate * tokens:,.0f} pushes/s), the server's CPU "
        f"{server.cpu * 1000:.2f} ms each; ours/bare: rate {rate_ratio:.0%} "
        f"({meets(rate_ratio >= RATIO_TARGET)}), by CPU {cpu_ratio:.0%} "
        f"({meets(cpu_ratio >= RATIO_TARGET)}; target >= {RATIO_TARGET:.0%})"
    )
    label = f"{tokens} token(s)"
    if name == "bare unwrap+decrypt":
        results.add(f"ours, {label}", f"{server.rate:,.0f}", value=server.rate, unit="triggers/s")
        results.add(
            f"server CPU per trigger, {label}", f"{server.cpu * 1000:.2f} ms", value=server.cpu, unit="s"
        )
    results.add(f"{name}, {label}", f"{bare.rate:,.0f}", value=bare.rate, unit="triggers/s")
    results.add(f"{name} CPU per trigger, {label}", f"{bare.cpu * 1000:.2f} ms", value=bare.cpu, unit="s")
    for kind, ratio in (("rate", rate_ratio), ("CPU", cpu_ratio)):
        results.add(
            f"ours/{name} by {kind}, {label}",
            f"{ratio:.0%}",
            f">= {RATIO_TARGET:.0%}",
            meets(ratio >= RATIO_TARGET),
            value=ratio,
        )


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
        default=0,
        help="every Nth token is an FCM one, the rest APNs (default 0: APNs only; the bare loop with "
        "sends runs only then)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="triggers in flight in the bare loop with sends (default 64, as MARMOT_MAX_CONCURRENT)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="XMTP_PUSH_NAME=VALUE", help="a setting for the server"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per size, each on fresh triggers; medians are compared (default 3)",
    )
    parser.add_argument("--json", help="also write the results as JSON to this path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_on_fastest_loop(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
