"""A Redis outage costs the worker's log a line per loop, not a stack trace per retry.

The worker runs in this process against a Redis address where nothing listens. Each loop (fan-out
consumers, one delivery worker per channel, retry promotion) says once that Redis is unavailable
and backs off; none logs a stack, and the volume stays flat however long the outage lasts.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from app.runtime import open_runtime
from tests.support import make_settings
from workers.runner import run_workers


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once it is closed


async def test_a_redis_outage_is_logged_once_per_loop_without_stacks(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(
        sqlite_url, redis_url=f"redis://127.0.0.1:{closed_port()}/0", fanout_concurrency=2
    )
    stop = asyncio.Event()
    async with open_runtime(settings) as runtime:
        with caplog.at_level(logging.INFO, logger="workers"):
            worker = asyncio.create_task(run_workers(runtime, stop))
            await asyncio.sleep(4.0)
            stop.set()
            await asyncio.wait_for(worker, 15)
    records = [r for r in caplog.records if r.name.startswith("workers") and r.levelno >= logging.WARNING]
    loops = 2 + 3 + 1  # fan-out consumers, delivery workers (apns, fcm, http), retry promotion
    assert records, "the outage was not reported at all"
    assert len(records) <= 2 * loops, [r.getMessage() for r in records]
    assert all(r.exc_info is None for r in records)
    assert all("unavailable" in r.getMessage() for r in records)
