"""Benchmark (not a test): the legacy notifications.v1 path against the new API's, in one run, PostgreSQL
and Redis, `xmtp-push api` and one worker, pushes to the APNs fake (docs/legacy.md#from-envelope-to-push).

- throughput: the same ingested envelopes (group messages with should_push) to the same 1,000 APNs tokens,
  first as the new API's recipients (bench.channels' pipeline, registered over gRPC), then as legacy
  installations registered over Connect (RegisterInstallation, Subscribe), in --rounds rounds (3) that
  alternate the two. Rate = pushes / (the fake's last request - the first ingest request). Target: the
  legacy median >= 90 % of the new API's. The legacy side fans each envelope out for the new API too (to
  no recipient), as a deployment serving both does.
- fanout: one envelope to a topic of --subscribers APNs subscribers (bulk-inserted), first the new API's
  recipients, then legacy subscriptions: the time from the ingest request until every delivery job is on
  its stream (entries-added), and until the fake has them all. Target: legacy <= 1.5x the new API's.
The new API's side runs with the legacy API off, as it is by default; the legacy side with it on."""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import ClientSession, ClientTimeout
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from app.core.channels import Channel
from app.core.config import Settings
from app.legacy import topics as legacy_topics
from app.legacy.jobs import legacy_delivery_stream
from app.legacy.models import LegacyInstallation, LegacySubscription
from app.queue.base import partition_of
from app.queue.redis_calls import stream_key
from app.recipients.types import WireChannel
from bench import _support as support
from bench._support import Results, verdict
from bench.channels import (
    PER_TOPIC,
    RECIPIENTS,
    REDIS_URL,
    REGISTERING,
    STALL_SECONDS,
    TOPICS,
    Run,
    backend_settings,
    run_pipeline,
    running_fake,
)
from bench.pipeline import Backend, Ingestor, running_backend
from bench.pipeline.scenarios import entries_added, queued_at

RATIO_TARGET, FANOUT_TARGET = 0.90, 1.5  # legacy hints/s >= 90 % of the new API's; queued <= 1.5x its time
LEGACY_ON = ["LEGACY_API_ENABLED=true"]
SERVICE = "/notifications.v1.Notifications"
WARM_SUBSCRIBERS = 200  # of the topic whose envelope opens connections before the fan-out is timed
INSTALLATION_COLUMNS = tuple(c.name for c in LegacyInstallation.__table__.columns)
LEGACY_SUBSCRIPTION_COLUMNS = tuple(c.name for c in LegacySubscription.__table__.columns)


def topic_string(topic: bytes) -> str:
    text = legacy_topics.to_string(topic)
    assert text is not None, "a group topic has its legacy string"
    return text


async def register_installations(backend: Backend, channel: str, tokens: Sequence[tuple[str, bytes]]) -> None:
    """A legacy installation per (APNs token, topic), as iOS's XMTPPush makes it: RegisterInstallation,
    then Subscribe to the topic's string, over Connect JSON, REGISTERING at a time."""
    base, work = f"http://127.0.0.1:{backend.http_port}{SERVICE}", iter(tokens)
    async with ClientSession(timeout=ClientTimeout(total=60)) as session:

        async def call(method: str, body: dict[str, Any]) -> None:
            async with session.post(f"{base}/{method}", json=body) as answer:
                answer.raise_for_status()

        async def one() -> None:
            for token, topic in work:
                installation = str(uuid.uuid4())
                mechanism = {"apnsDeviceToken": token}
                await call(
                    "RegisterInstallation", {"installationId": installation, "deliveryMechanism": mechanism}
                )
                subscription = [topic_string(topic)]
                await call("Subscribe", {"installationId": installation, "topics": subscription})

        await asyncio.gather(*(one() for _ in range(REGISTERING)))


async def throughput(args: argparse.Namespace, results: Results) -> None:
    topics = [b"\x00" + secrets.token_bytes(16) for _ in range(TOPICS)]
    recipients = [(f"ok.{k}", topics[k % TOPICS]) for k in range(RECIPIENTS)]
    envelopes = [(topics[i % TOPICS], 1000 + i) for i in range(-(-args.hints // PER_TOPIC))]
    plan = [(token, topic, seq) for topic, seq in envelopes for token, on in recipients if on == topic]
    options = argparse.Namespace(channel="apns", env=args.env)
    async with ClientSession(timeout=ClientTimeout(total=60)) as session, running_fake("apns") as fake:
        run = Run(options, session, fake, recipients, envelopes, plan, results)
        ours_runs, legacy_runs = [], []
        # Rounds alternate the two, so that a change in the host's load weighs on both alike.
        for number in range(1, args.rounds + 1):
            suffix = f" #{number}" if args.rounds > 1 else ""
            ours_runs.append(await run_pipeline(run, f"new API{suffix}"))
            await fake.reset(session)
            legacy_runs.append(await run_pipeline(run, f"legacy{suffix}", register_installations, LEGACY_ON))
            await fake.reset(session)
    ours, legacy = statistics.median(ours_runs), statistics.median(legacy_runs)
    rounds = [f"{b / a * 100:.0f} %" for a, b in zip(ours_runs, legacy_runs, strict=True) if a]
    ratio, target = legacy / ours if ours else 0.0, f">= {RATIO_TARGET * 100:.0f} %"
    name = "ratio legacy/new API, hints/s" + (
        f" (medians of {args.rounds} rounds)" if args.rounds > 1 else ""
    )
    results.add(name, f"{ratio * 100:.0f} %", target, verdict(ratio >= RATIO_TARGET))
    if args.rounds > 1:
        results.add("ratio in each round", ", ".join(rounds))


def new_api_rows(topic: bytes, tokens: Sequence[str]) -> list[tuple[str, Sequence[str], list[Any]]]:
    now, ids = time.time_ns(), [secrets.token_bytes(32) for _ in tokens]
    apns = int(WireChannel.APNS)
    recipients = [
        (i, secrets.token_bytes(32), apns, t, None, 1, now, now) for i, t in zip(ids, tokens, strict=True)
    ]
    subscriptions = [(topic, i, now - 10**10, None, None, False) for i in ids]
    return [
        ("recipients", support.RECIPIENT_COLUMNS, recipients),
        ("subscriptions", support.SUBSCRIPTION_COLUMNS, subscriptions),
    ]


def legacy_rows(topic: bytes, tokens: Sequence[str]) -> list[tuple[str, Sequence[str], list[Any]]]:
    now, text, ids = time.time_ns(), topic_string(topic), [str(uuid.uuid4()) for _ in tokens]
    apns = 1  # app.legacy.commands.MechanismKind.APNS
    installations = [(i, apns, t, now, False) for i, t in zip(ids, tokens, strict=True)]
    subscriptions = [(text, i, True, False, now) for i in ids]
    return [
        ("legacy_installations", INSTALLATION_COLUMNS, installations),
        ("legacy_subscriptions", LEGACY_SUBSCRIPTION_COLUMNS, subscriptions),
    ]


async def fan_out_once(args: argparse.Namespace, label: str, legacy: bool, results: Results) -> float:
    """One envelope to a topic of args.subscribers: seconds until every delivery job is queued."""
    topic, warm = (b"\x00" + secrets.token_bytes(16) for _ in range(2))
    tokens = [f"ok.{label[0]}{k}" for k in range(args.subscribers)]
    warm_tokens = [f"ok.warm{k}" for k in range(WARM_SUBSCRIBERS)]
    rows = legacy_rows if legacy else new_api_rows
    partitions = Settings.model_fields["queue_partitions"].default
    stream = legacy_delivery_stream(Channel.APNS) if legacy else "deliveries.apns"
    key = stream_key(stream, partition_of(topic, partitions))
    Redis.from_url(REDIS_URL).flushdb()
    async with (
        ClientSession(timeout=ClientTimeout(total=60)) as session,
        running_fake("apns") as fake,
        support.bench_database() as url,
    ):
        await support.copy_tables(url, [*rows(topic, tokens), *rows(warm, warm_tokens)])
        settings = [*backend_settings("apns", fake), *(LEGACY_ON if legacy else []), *args.env]
        options = argparse.Namespace(mode="redis", workers=1, env=settings)
        async with running_backend(options, url, REDIS_URL) as backend:
            ingest, redis = Ingestor(session, backend.http_port), AsyncRedis.from_url(REDIS_URL)
            await ingest.closed_loop([(warm, 1)], 1, 1)
            await fake.wait_for(session, WARM_SUBSCRIBERS, STALL_SECONDS)
            await fake.reset(session)
            watch = asyncio.create_task(
                queued_at(redis, key, args.subscribers + await entries_added(redis, key))
            )
            log = await ingest.closed_loop([(topic, 2)], 1, 1)
            done = await watch
            stats = await fake.wait_for(session, args.subscribers, STALL_SECONDS)
            await redis.aclose()
    queued = (done - log.first_sent) / 1e9 if done else math.nan
    received = (stats["last_ns"] - log.first_sent) / 1e9
    print(
        f"{label}: {args.subscribers:,} delivery jobs queued in {queued:.3f} s, received in {received:.3f} s"
    )
    twice = stats["count"] - stats["unique"]
    whole = f"{stats['unique']:,} of {args.subscribers:,} received in {received:.2f} s, {twice} twice"
    results.add(f"{label}: ingest -> all delivery jobs queued", f"{queued:.3f} s")
    complete = stats["unique"] == args.subscribers and not twice
    results.add(f"{label}: pushes at the fake", whole, "all, once", verdict(complete))
    return queued


async def fanout(args: argparse.Namespace, results: Results) -> None:
    ours = await fan_out_once(args, "new API", False, results)
    legacy = await fan_out_once(args, "legacy", True, results)
    times, target = legacy / ours, f"<= {FANOUT_TARGET:g}x"
    results.add(
        f"legacy/new API, queue {args.subscribers:,}",
        f"{times:.2f}x",
        target,
        verdict(times <= FANOUT_TARGET),
    )


async def amain(args: argparse.Namespace) -> int:
    print(f"{support.environment_line()}\nload average {support.load_average()}; backend settings {args.env}")
    results = Results(f"legacy notifications.v1 vs the new API, redis mode, 1 worker ({args.scenario})")
    if args.scenario in ("throughput", "both"):
        await throughput(args, results)
    if args.scenario in ("fanout", "both"):
        await fanout(args, results)
    print(f"load average at the end {support.load_average()}")
    results.print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser("python -m bench.legacy", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--scenario", choices=["throughput", "fanout", "both"], default="both")
    parser.add_argument("--hints", type=int, default=60_000, help="pushes of each throughput round")
    parser.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds, each the new API then legacy"
    )
    parser.add_argument("--subscribers", type=int, default=100_000, help="subscribers of the fan-out topic")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="backend setting")
    sys.exit(support.run_on_fastest_loop(amain(parser.parse_args())))
