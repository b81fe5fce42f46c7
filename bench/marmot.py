"""Benchmark: Marmot triggers published to a local relay (rust-nostr's LocalRelay) and pushed by `xmtp-push
marmot` (rate tiers, pending buffer raised) to the APNs and FCM fakes, against bare loops here: unwrap and
decrypt; unwrap, decrypt and send via aioapns to the same fake; the delivery core's APNs provider's CPU per
push (these two for APNs-only batches). Rate: triggers / (last push - first gift wrap sent). CPU: the server
process's per trigger. Medians of R rounds on fresh triggers; target >= 70 % of the bare loops."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple

import aiohttp
import nostr_sdk as nostr
from aioapns.common import NotificationRequest, PushType

from app.delivery.credentials import ApnsCredentials
from app.delivery.providers.apns import ApnsProvider
from app.delivery.types import OutcomeKind
from app.marmot import dispatch, giftwrap, secp
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, decrypt_token, encrypt_token
from app.marmot.unwrap import split_chunks, unwrap_trigger
from bench import _support as support
from bench._support import Results, load_average, process_cpu_seconds, service_collector, verdict
from bench.channels import BUNDLE_ID, KEY_ID, TEAM_ID, Fake, backend_settings, bare_apns_client, running_fake
from fakes import keys

RATIO_TARGET = 0.70
CONCURRENCY = 64  # triggers (the core: pushes) in flight in the bare loops, as MARMOT_MAX_CONCURRENT
SERVING = re.compile(r"Marmot server: \d+ relay\(s\), http=\S*:(\d+)")
RAISED = 1_000_000_000  # rate tiers, pending buffer and relay rate limit: out of the way
STALL_SECONDS = 20.0
SILENT = {"aps": {"content-available": 1}}  # the body the server sends (app/marmot/dispatch.py)
silent = functools.partial(NotificationRequest, message=SILENT, priority=5, push_type=PushType.BACKGROUND)
Wraps = list[dict[str, Any]]


def make_triggers(key: ServerKey, count: int, tokens: int, tag: int, every: int) -> tuple[Wraps, int, int]:
    """Gift wraps of `tokens` distinct tokens, every `every`-th an FCM one; APNs and FCM token counts."""
    chunks = []
    for serial in range(count * tokens):
        fcm = every and not serial % every
        text = f"ok.{tag}.{serial}" if fcm else f"{tag:02x}{serial:062x}"
        chunks.append(encrypt_token(key.public_x, Platform.FCM if fcm else Platform.APNS, text))
    starts, fcm_tokens = range(0, len(chunks), tokens), len(range(0, len(chunks), every)) if every else 0
    wraps = [giftwrap.wrap_trigger(b"".join(chunks[i : i + tokens]), key.public_x) for i in starts]
    return wraps, len(chunks) - fcm_tokens, fcm_tokens


def bare_loop(key: ServerKey, wraps: Wraps) -> dict[str, float]:
    """Unwrap and decrypt every trigger in turn: triggers/s and this thread's CPU ms per trigger."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    for wrap in wraps:
        for chunk in split_chunks(unwrap_trigger(wrap, key)):
            decrypt_token(key.secret, chunk)
    seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
    return {"bare_rate": len(wraps) / seconds, "bare_ms": cpu * 1000 / len(wraps)}


async def in_flight(items: Iterable[Any], handle: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    """`handle` every item, CONCURRENCY at a time; what each returned."""
    queue, returned = iter(items), []

    async def worker() -> None:
        for item in queue:
            returned.append(await handle(item))

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return returned


class Bench(NamedTuple):
    key: ServerKey  # the server's, that triggers are wrapped to
    session: aiohttp.ClientSession
    relay_url: str
    apns: Fake
    fcm: Fake
    server_pid: int

    def tokens(self, wrap: dict[str, Any]) -> list[Any]:
        return [decrypt_token(self.key.secret, c) for c in split_chunks(unwrap_trigger(wrap, self.key))]

    async def bare_round(self, client: Any, wraps: Wraps) -> None:
        async def trigger(wrap: dict[str, Any]) -> None:  # a trigger's tokens sent together
            pushes = [silent(token.token) for token in self.tokens(wrap)]
            sent = await asyncio.gather(*(asyncio.wait_for(client.send_notification(r), 10) for r in pushes))
            if not all(result.is_successful for result in sent):
                raise RuntimeError("the APNs fake refused a bare push")

        await in_flight(wraps, trigger)

    async def bare_sends(self, wraps: Wraps, apns_tokens: int) -> dict[str, float]:
        """Unwrap+decrypt+send: triggers/s (0 when a push is missing), this process's CPU per trigger."""
        client = bare_apns_client(self.apns)
        await self.bare_round(client, make_triggers(self.key, 50, 2, 0xFF, 0)[0])  # connections, JWT
        await self.apns.reset(self.session)
        cpu_before, started = process_cpu_seconds(os.getpid()), time.monotonic_ns()
        with service_collector():
            await self.bare_round(client, wraps)
        stats = await self.apns.wait_for(self.session, apns_tokens, STALL_SECONDS)
        cpu = process_cpu_seconds(os.getpid()) - cpu_before
        client.pool.close()
        rate = len(wraps) * 1e9 / (int(stats["last_ns"]) - started) if stats["unique"] >= apns_tokens else 0
        return {"sends_rate": rate, "sends_ms": cpu * 1000 / len(wraps)}

    async def core_sends(self, wraps: Wraps) -> dict[str, float]:
        """CPU per push of the server's own APNs provider, here, the pushes rendered as it renders them."""
        pushes = [dispatch.render(token) for wrap in wraps for token in self.tokens(wrap)]
        url = f"https://127.0.0.1:{self.apns.send_port}"
        credentials = ApnsCredentials(keys.apns_key_pem(), KEY_ID, TEAM_ID, BUNDLE_ID, url, self.apns.ca_file)
        provider = ApnsProvider(credentials, 10)
        await in_flight(pushes[:100], provider.send)  # connections and the JWT
        cpu_before = process_cpu_seconds(os.getpid())
        with service_collector():
            outcomes = await in_flight(pushes, provider.send)
        cpu = process_cpu_seconds(os.getpid()) - cpu_before
        await provider.close()
        if sum(outcome.kind is OutcomeKind.DELIVERED for outcome in outcomes) < len(pushes):
            raise RuntimeError(f"the delivery core did not deliver all {len(pushes)} pushes")
        return {"push_us": cpu * 1e6 / len(pushes)}

    async def ours(self, wraps: Wraps, apns_tokens: int, fcm_tokens: int) -> dict[str, float]:
        """Gift wraps over one websocket: triggers/s (0 on a stall), CPU ms per trigger of each process."""
        await asyncio.gather(self.apns.reset(self.session), self.fcm.reset(self.session))
        pids = (self.server_pid, self.apns.proc.pid, self.fcm.proc.pid, os.getpid())
        cpu_before = {pid: process_cpu_seconds(pid) for pid in pids}
        async with self.session.ws_connect(self.relay_url, max_msg_size=0) as ws:
            started = time.monotonic_ns()
            for wrap in wraps:
                await ws.send_str(json.dumps(["EVENT", wrap]))
            replies = [json.loads((await ws.receive(timeout=60)).data) for _ in wraps]  # its OKs
            if refused := [reply for reply in replies if reply[0] != "OK" or not reply[2]]:
                raise RuntimeError(f"the relay refused gift wraps: {refused[:3]}")
        relay_s = (time.monotonic_ns() - started) / 1e9  # until the relay took them all
        apns = await self.apns.wait_for(self.session, apns_tokens, STALL_SECONDS)
        fcm = await self.fcm.wait_for(self.session, fcm_tokens, STALL_SECONDS)
        ms = [(process_cpu_seconds(pid) - cpu_before[pid]) * 1000 / len(wraps) for pid in pids]
        seconds = (max(int(apns["last_ns"]), int(fcm["last_ns"])) - started) / 1e9
        if apns["unique"] < apns_tokens or fcm["unique"] < fcm_tokens:
            print(f"  stalled: APNs {apns['unique']}/{apns_tokens}, FCM {fcm['unique']}/{fcm_tokens}")
            seconds = float("inf")
        figures = {"ours_rate": len(wraps) / seconds, "ours_ms": ms[0], "fakes_ms": ms[1] + ms[2]}
        return figures | {"run_ms": sum(ms), "relay_s": relay_s}

    async def one_size(self, args: argparse.Namespace, tokens: int, results: Results) -> bool:
        """R rounds, each on fresh triggers, and their medians (each figure's own); False on a stall."""
        print(f"{tokens} token(s) per trigger, {args.triggers} triggers; load {load_average()}")
        rounds = []
        for tag in ((tokens * 16 + number) % 256 for number in range(args.rounds)):
            batch = make_triggers(self.key, args.triggers, tokens, tag, args.fcm_every)
            with service_collector():
                figures = bare_loop(self.key, batch[0])
            if not batch[2]:  # the bare loop with sends and the core send to APNs only
                figures |= await self.bare_sends(*batch[:2]) | await self.core_sends(batch[0])
            rounds.append(figures | await self.ours(*batch))
            print(f"  round {len(rounds)}:", ", ".join(f"{k} {v:,.2f}" for k, v in rounds[-1].items()))
        if not all(value for r in rounds for name, value in r.items() if name.endswith("_rate")):
            return False
        record(results, tokens, {name: statistics.median(r[name] for r in rounds) for name in rounds[0]})
        return True


def record(results: Results, tokens: int, median: dict[str, float]) -> None:
    """Ours against each bare loop, and the cores the target rate takes at the costs measured."""
    label, rate, cpu = f"{tokens} token(s)", median["ours_rate"], median["ours_ms"]
    ratios: dict[str, float] = {}
    results.add(f"ours, {label}", f"{rate:,.0f} triggers/s ({rate * tokens:,.0f} pushes/s), {cpu:.2f} ms CPU")
    for loop, name in (("bare", "bare unwrap+decrypt"), ("sends", "bare unwrap+decrypt+send")):
        if f"{loop}_rate" in median:
            loop_rate, loop_cpu = median[f"{loop}_rate"], median[f"{loop}_ms"]
            results.add(f"{name}, {label}", f"{loop_rate:,.0f} triggers/s, {loop_cpu:.2f} ms CPU")
            ratios |= {f"ours/{name} by rate": rate / loop_rate, f"ours/{name} by CPU": loop_cpu / cpu}
    if "push_us" in median:
        own = cpu - tokens * median["push_us"] / 1000  # what the Marmot path spends beside its pushes
        what = "delivery core CPU per push; server CPU per trigger less its pushes"
        results.add(f"{what}, {label}", f"{median['push_us']:.0f} us; {own:.2f} ms")
        ratios["ours/bare unwrap+decrypt by CPU, pushes aside"] = median["bare_ms"] / own
    for name, ratio in ratios.items():
        meets = verdict(ratio >= RATIO_TARGET)
        results.add(f"{name}, {label}", f"{ratio:.0%}", f">= {RATIO_TARGET:.0%}", meets)
    target, cores = RATIO_TARGET * median["bare_rate"], os.cpu_count()
    value = f"server {cpu * target / 1000:.2f} (one process: at most {1000 / cpu:,.0f} triggers/s); server, "
    value += f"fakes, relay and publisher {median['run_ms'] * target / 1000:.2f}; the host has {cores}"
    results.add(f"cores the target rate ({target:,.0f} triggers/s) takes, {label}", value)


def marmot_env(key: ServerKey, relay_url: str, apns: Fake, fcm: Fake, extra: list[str]) -> dict[str, str]:
    """Both channels at the fakes; every rate tier, and the pending buffer (a burst is larger), raised."""
    tiers = [f"MARMOT_{t}_PER_{p}" for t in ("GLOBAL", "CHUNK", "DEVICE") for p in ("MINUTE", "HOUR")]
    settings = [*backend_settings("apns", apns), *backend_settings("fcm", fcm), "HTTP_HOST=127.0.0.1"]
    settings += [f"MARMOT_SECRET_KEY={key.secret.hex()}", f"MARMOT_RELAYS={relay_url}", "HTTP_PORT=0"]
    settings += ["MARMOT_ALLOW_UNENCRYPTED_RELAYS=true"]  # the bench's relay: ws:// on loopback
    settings += ["LOG_LEVEL=INFO", *(f"{name}={RAISED}" for name in [*tiers, "MARMOT_PENDING_BYTES"])]
    return support.xmtp_push_env(dict(s.split("=", 1) for s in settings)) | dict(
        e.split("=", 1) for e in extra
    )


async def wait_ready(session: aiohttp.ClientSession, http_port: int) -> None:
    for _ in range(300):  # 30 s
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{http_port}/readyz") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError("xmtp-push marmot did not become ready")


async def run(args: argparse.Namespace) -> int:
    print(support.environment_line(), f"load {load_average()}")
    key, results = ServerKey(secp.fresh_secret()), Results("Marmot triggers via a relay vs bare loops")
    relay = nostr.LocalRelayBuilder().addr("127.0.0.1")
    relay = relay.rate_limit(nostr.RateLimit(max_reqs=1000, notes_per_minute=RAISED)).build()
    await relay.run()
    async with running_fake("apns") as apns, running_fake("fcm") as fcm, aiohttp.ClientSession() as session:
        env = marmot_env(key, relay_url := str(await relay.url()), apns, fcm, args.env)
        server = await support.start_xmtp_push("marmot", env, SERVING)
        try:
            await wait_ready(session, int(server.match.group(1)))
            bench = Bench(key, session, relay_url, apns, fcm, server.pid)
            await bench.ours(*make_triggers(key, 50, 2, 0, 2))  # warm-up, FCM's OAuth token too
            passed = [await bench.one_size(args, tokens, results) for tokens in args.tokens]
        finally:
            await support.stop_process(server)
    relay.shutdown()
    results.print()
    return 0 if all(passed) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.marmot", description=__doc__)
    parser.add_argument("--triggers", type=int, default=1000, help="triggers per round")
    parser.add_argument("--tokens", type=lambda text: [int(n) for n in text.split(",")], default=[1, 10])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size, medians compared")
    parser.add_argument("--fcm-every", type=int, default=0, help="every Nth token an FCM one (0: APNs only)")
    parser.add_argument("--env", action="append", default=[], metavar="XMTP_PUSH_NAME=VALUE")
    raise SystemExit(support.run_on_fastest_loop(run(parser.parse_args())))
