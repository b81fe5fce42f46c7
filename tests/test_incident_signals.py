"""What an operator sees of Redis on a bad day (docs/operations.md, "When something is down"): a
Redis that keeps nothing on disk is said at start; while Redis is down, /status still answers and
names it, `xmtp_push_dependency_up` says 0 and the queue's depth is left out; a Redis that comes
back without its data is one ERROR and `xmtp_push_queue_resets_total`. Against a Redis the test
starts and kills itself, without and with AOF, and the real `api` process.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from app.queue.kept import LOST, NOT_KEPT
from tests.support import create_sqlite_database, eventually
from tests.support.ops import child_env, free_port
from tests.support.own_redis import redis_server
from tests.support.pipeline import metric, parse_metrics
from tests.support.process import Child, child, events

pytestmark = [pytest.mark.slow, pytest.mark.tools("redis-server")]
SERVING = re.compile(r"serving http=\S+ grpc=\S+")


@asynccontextmanager
async def api_on(redis_port: int, tmp_path: Path) -> AsyncIterator[tuple[Child, httpx.AsyncClient]]:
    http_port = free_port()
    env = child_env(
        database_url=await create_sqlite_database(tmp_path),
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        http_port=str(http_port),
        grpc_port=str(free_port()),
    )
    async with (
        child("api", ["api"], env) as api,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=20) as client,
    ):
        await api.line(SERVING)
        yield api, client
        assert await api.stop() == 0


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return parse_metrics(response.text)


def said(api: Child, text: str) -> list[dict[str, object]]:
    return [e for e in events(api) if text in str(e["event"])]


async def test_redis_without_persistence_down_then_back_empty(tmp_path: Path) -> None:
    port = free_port()
    async with redis_server(port) as redis, api_on(port, tmp_path) as (api, client):
        assert [e["level"] for e in said(api, NOT_KEPT)] == ["warning"], api.output()
        up = await scrape(client)
        assert metric(up, "xmtp_push_dependency_up", dependency="redis") == 1
        assert ("xmtp_push_queue_depth", frozenset({("queue", "envelopes")})) in up

        redis.kill()
        await redis.wait()
        page = await client.get("/status")
        assert page.status_code == 200, page.text
        assert '<td>redis</td><td class="bad">unavailable</td>' in page.text
        assert "Unknown: Redis does not answer." in page.text
        down = await scrape(client)
        assert metric(down, "xmtp_push_dependency_up", dependency="redis") == 0
        assert metric(down, "xmtp_push_dependency_up", dependency="database") == 1
        assert not [name for name, _ in down if name == "xmtp_push_queue_depth"], "an unknown depth shown"

        async with redis_server(port):  # the same port, empty
            await eventually(lambda: _status_ok(client), 30, "the status page with Redis back")
            await eventually(lambda: bool(said(api, LOST)), 30, "the lost data to be said")
            back = await scrape(client)
    assert [e["level"] for e in said(api, LOST)] == ["error"], api.output()
    assert metric(back, "xmtp_push_queue_resets_total") == 1
    assert metric(back, "xmtp_push_dependency_up", dependency="redis") == 1
    assert ("xmtp_push_queue_depth", frozenset({("queue", "envelopes")})) in back


async def _status_ok(client: httpx.AsyncClient) -> bool:
    page = await client.get("/status")
    return page.status_code == 200 and '<td>redis</td><td class="ok">ok</td>' in page.text


async def test_redis_with_aof_restarted_keeps_the_queue_and_says_nothing_of_it(tmp_path: Path) -> None:
    port, kept = free_port(), tmp_path / "redis"
    kept.mkdir()
    async with api_on(port, tmp_path) as (api, client):
        async with redis_server(port, keeps_in=kept) as redis:
            await eventually(lambda: _status_ok(client), 30, "the status page with Redis")
            redis.terminate()
            await redis.wait()
        assert (await client.get("/status")).status_code == 200
        async with redis_server(port, keeps_in=kept):
            await eventually(lambda: _status_ok(client), 30, "the status page with Redis back")
            back = await scrape(client)
    assert not said(api, NOT_KEPT) and not said(api, LOST), api.output()
    assert metric(back, "xmtp_push_queue_resets_total") == 0
