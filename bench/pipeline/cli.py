"""`python -m bench.pipeline`: the flags, and one scenario run ending with its summary table."""

from __future__ import annotations

import argparse
from typing import Any

import bench.pipeline
from bench._support import DEFAULT_ADMIN_DSN, run_on_fastest_loop
from bench.pipeline.fanout import scenario_fanout
from bench.pipeline.rate import scenario_rate
from bench.pipeline.shared import header
from bench.pipeline.summary import Summary
from bench.pipeline.throughput import scenario_throughput

SCENARIO_DEFAULTS: dict[str, dict[str, Any]] = {
    "throughput": {"subscribers": 1000, "topics": 10, "envelopes": 1000, "rate": 0.0},
    "fanout": {"subscribers": 100_000},
    "latency": {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 30.0},
    "soak": {"subscribers": 2000, "topics": 1000, "rate": 1000.0, "duration": 600.0},
}


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["memory", "redis"], default="redis")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (redis mode)")
    parser.add_argument("--scenario", choices=list(SCENARIO_DEFAULTS), default="throughput")
    parser.add_argument("--envelopes", type=int, help="throughput: envelopes to ingest (default 1000)")
    parser.add_argument(
        "--subscribers", type=int, help="recipients (throughput 1000, fanout 100000, latency 2000)"
    )
    parser.add_argument(
        "--topics", type=int, help="topics the recipients are spread over (throughput 10, latency 1000)"
    )
    parser.add_argument(
        "--rate", type=float, help="hints (deliveries) per second, open loop; 0 = as fast as possible"
    )
    parser.add_argument("--duration", type=float, help="latency/soak: seconds of load (30 / 600)")
    parser.add_argument(
        "--batch", type=int, default=100, help="throughput at full speed: envelopes per request"
    )
    parser.add_argument("--ingest-concurrency", type=int, default=4)
    parser.add_argument("--tick", type=float, default=0.01, help="open loop: seconds between ingest requests")
    parser.add_argument("--bare-concurrency", type=int, default=256)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare loop")
    parser.add_argument("--register-concurrency", type=int, default=32)
    parser.add_argument(
        "--fanout-warmup", type=int, default=200, help="fanout: subscribers of the warm-up topic"
    )
    parser.add_argument(
        "--queue-only",
        action="store_true",
        help="fanout: stop once every job is queued (do not wait for all receipts)",
    )
    parser.add_argument(
        "--stall", type=float, default=20.0, help="give up waiting after this long without a receipt"
    )
    parser.add_argument("--rss-every", type=float, default=10.0)
    parser.add_argument("--window", type=float, help="latency windows in seconds (10, soak 60)")


def add_environment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sample-every", type=int, default=1000, help="receiver keeps headers of every Nth hook"
    )
    parser.add_argument("--receiver-port", type=int, default=0)
    parser.add_argument(
        "--db", choices=["postgres", "sqlite"], default="postgres", help="sqlite only with --mode memory"
    )
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--redis-db", type=int, default=13, help="dedicated Redis DB, flushed first")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra backend setting, e.g. DELIVERY_CONCURRENCY=512 (XMTP_PUSH_ prefix optional)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the summary (and per-window series) as JSON to PATH"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline",
        description=bench.pipeline.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_load_arguments(parser)
    add_environment_arguments(parser)
    args = parser.parse_args(argv)
    for name, value in SCENARIO_DEFAULTS[args.scenario].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name, value in {"envelopes": 1000, "topics": 1, "rate": 0.0, "duration": 30.0}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.db == "sqlite" and args.mode != "memory":
        parser.error("--db sqlite needs --mode memory (workers in several processes need PostgreSQL)")
    if args.scenario in ("latency", "soak") and not args.rate:
        parser.error("--rate must be > 0 for latency and soak")
    return args


def describe_run(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "scenario",
        "mode",
        "workers",
        "db",
        "subscribers",
        "topics",
        "envelopes",
        "rate",
        "duration",
        "env",
    )
    return {name: getattr(args, name) for name in names}


async def amain(args: argparse.Namespace) -> int:
    header(args)
    summary = Summary()
    if args.scenario == "throughput":
        await scenario_throughput(args, summary)
    elif args.scenario == "fanout":
        await scenario_fanout(args, summary)
    else:
        await scenario_rate(args, summary)
    workers = f", {args.workers} worker(s)" if args.mode == "redis" else ""
    summary.title = f"{args.scenario}, {args.mode} mode{workers}, database {args.db}"
    summary.info["run"] = describe_run(args)
    summary.print(summary.title)
    summary.write(args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_on_fastest_loop(amain(parse_args(argv)))
