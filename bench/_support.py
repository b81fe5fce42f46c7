"""What the benchmarks share: a throw-away migrated PostgreSQL database and latency summaries."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import secrets
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import asyncpg

from app.core.collector import settle_after_start_up
from app.core.config import Settings
from app.core.migrations import upgrade
from app.recipients.models import Recipient, Subscription

DEFAULT_ADMIN_DSN = os.environ.get("XMTP_PUSH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")

# The tables' columns in their declared order: the order the benchmarks build their rows in.
RECIPIENT_COLUMNS = tuple(column.name for column in Recipient.__table__.columns)
SUBSCRIPTION_COLUMNS = tuple(column.name for column in Subscription.__table__.columns)


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def bench_database(admin_dsn: str, *, keep: bool = False) -> AsyncIterator[str]:
    """A fresh database `xmtp_push_bench_<hex>`, migrated with Alembic; yields its SQLAlchemy URL.

    Dropped (WITH FORCE) on the way out unless `keep`.
    """
    name = f"xmtp_push_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base = admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    url = f"{base}/{name}"
    print(f"database: created {name}")
    try:
        # upgrade() runs its own event loop (alembic env.py), so keep it off this one.
        await asyncio.to_thread(upgrade, Settings(database_url=url))
        print(f"database: migrated {name} to head")
        yield url
    finally:
        if keep:
            print(f"database: kept {name} (--keep-db)")
        else:
            admin = await asyncpg.connect(admin_dsn)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()
            print(f"database: dropped {name}")


async def server_version(dsn: str) -> str:
    connection = await asyncpg.connect(dsn)
    try:
        return str(await connection.fetchval("SHOW server_version"))
    finally:
        await connection.close()


def environment_line() -> str:
    return f"host: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    values = sorted(s * 1000.0 for s in seconds)
    return {
        "n": float(len(values)),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": values[-1] if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


def format_ms(summary: dict[str, float]) -> str:
    return (
        f"p50 {summary['p50']:.2f} ms  p90 {summary['p90']:.2f} ms  p99 {summary['p99']:.2f} ms  "
        f"max {summary['max']:.2f} ms  (mean {summary['mean']:.2f} ms, n={int(summary['n'])})"
    )


@contextmanager
def service_collector() -> Iterator[str]:
    """The garbage-collector settings the backend's processes run with, for the span of a bare loop:
    the ceiling the backend is held against gets the same tuning. Python's defaults come back after.
    Yields a description for the benchmark's output."""
    threshold = Settings.model_fields["gc_young_threshold"].default
    before = gc.get_threshold()
    settle_after_start_up(threshold)
    try:
        yield f"start-up objects frozen, young-generation threshold {threshold:,} (as the backend)"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def run_on_fastest_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run the benchmark's own process on uvloop, as the backend's processes run: its bare loops
    are the ceiling the backend is held against, so they get the same event loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
