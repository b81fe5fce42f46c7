"""A Redis outage costs the worker's log one line, not a line per loop nor a stack trace per retry.

The worker runs in this process against a Redis address where nothing listens. Its loops (fan-out
consumers, one delivery worker per channel, retry promotion) all meet the outage and back off; the
process says once which service is down, by its setting, and what is wrong, and none logs a stack.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from app.runtime import open_runtime
from tests.support import make_settings
from workers.runner import run_workers

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once it is closed


async def test_a_redis_outage_is_logged_once_per_process_naming_redis_without_stacks(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(
        sqlite_url, redis_url=f"redis://127.0.0.1:{closed_port()}/0", fanout_concurrency=2
    )
    stop = asyncio.Event()
    async with open_runtime(settings) as runtime:
        with caplog.at_level(logging.INFO):
            worker = asyncio.create_task(run_workers(runtime, stop))
            await asyncio.sleep(4.0)
            stop.set()
            await asyncio.wait_for(worker, 15)
    records = [
        r for r in caplog.records if r.name.startswith(("workers", "app")) and r.levelno >= logging.WARNING
    ]
    assert len(records) == 1, [r.getMessage() for r in records]
    (told,) = records
    assert told.getMessage().startswith("XMTP_PUSH_REDIS_URL: Redis is unreachable (connection refused); ")
    assert told.getMessage().endswith(" retries with backoff")
    assert told.exc_info is None
