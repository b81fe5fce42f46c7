"""XMTP_PUSH_DATABASE_READ_URL against a real streaming replica (`make pg-replica`): fan-out pages and
delivery targets are read there, every write goes to the primary (a replica refuses writes, so a
write sent there would fail these tests), and a replica that is down holds fan-out back and fails
the worker's readiness until it returns, while the API goes on registering."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest

from app.api.main import create_app
from app.core.config import SettingsError, load_settings
from app.ops import failures
from app.runtime import open_runtime
from fakes.webhook_receiver import Receiver
from tests.support import create_postgres_database, drop_postgres_database, make_settings
from tests.support import pipeline as pipeline_support
from tests.support.ops import channel_env, free_port, xmtp_push
from tests.support.pipeline import Pipeline, Stack, envelope, group_topic, running_pipeline, wait_until
from tests.support.process import child, wait_answering
from tests.support.replica import (
    replica_service,
    replica_url,
    replicated,
    require_replica,
    sessions_on_replica,
)
from workers.server import WORKER_CHECKS, serving_probes

# Fixtures from the helper module, bound here so pytest finds them.
redis_url = pipeline_support.redis_url

PASSWORD = "pw-" + secrets.token_hex(6)  # in the unreachable replica's URL: never printed


@pytest.fixture
async def primary_url() -> AsyncIterator[str]:
    """A fresh database on the primary, which the replica receives by streaming replication."""
    await require_replica()
    url = await create_postgres_database()
    yield url
    await drop_postgres_database(url)


def replicated_stack(primary_url: str, redis_url: str) -> Stack:
    return Stack("redis", "postgresql", primary_url, redis_url)


async def readiness(port: int) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10) as client:
        answer: dict[str, object] = (await client.get(f"http://127.0.0.1:{port}/readyz")).json()
    return answer


async def hinted(pipe: Pipeline, topic: bytes, sequence_id: int) -> None:
    """Ingest one envelope on the topic (the API queues it; nothing is read from the replica)."""
    await pipe.ingest_ok([envelope(topic, sequence_id)])


def sequences(endpoint_hints: list[tuple[bytes, int, bytes]]) -> list[int]:
    return sorted(sequence for _, sequence, _ in endpoint_hints)


async def test_fan_out_reads_the_replica_and_stalls_while_it_is_down(
    primary_url: str, redis_url: str, receiver: Receiver
) -> None:
    replica = replica_url(primary_url)
    stack = replicated_stack(primary_url, redis_url)
    async with running_pipeline(
        stack, database_read_url=replica, metrics_port=0, queue_reclaim_seconds=1
    ) as pipe:
        assert pipe.runtime.replica is not None
        async with serving_probes(pipe.runtime, *WORKER_CHECKS) as port:
            topic, first = group_topic(), receiver.endpoint()
            member = await pipe.member(first, topic)  # written on the primary
            await replicated()
            await hinted(pipe, topic, 1)
            await wait_until(
                lambda: sequences(first.hints()) == [1], 15, "the hint fanned out from the replica"
            )
            assert await sessions_on_replica(primary_url) > 0
            assert (await readiness(port))["checks"] == {"redis": "ok", "providers": "ok", "replica": "ok"}

            await replica_service("stop")
            try:
                later = receiver.endpoint()
                late = await pipe.member(later, topic)  # Register and UpdateSubscriptions: the primary
                assert await pipe.recipient(late.rid) is not None
                await hinted(pipe, topic, 2)
                answer = await readiness(port)
                assert answer["status"] == "unavailable" and answer["checks"]["replica"] == "unavailable"  # type: ignore[index]
                await asyncio.sleep(3)
                assert sequences(first.hints()) == [1], "fan-out went on without the replica"
            finally:
                await replica_service("start")

            await wait_until(lambda: 2 in sequences(first.hints()), 30, "fan-out resuming with the replica")
            assert (await readiness(port))["status"] == "ok"
            await replicated()
            await hinted(pipe, topic, 3)
            await wait_until(lambda: 3 in sequences(later.hints()), 15, "the recipient registered meanwhile")
            assert member.rid != late.rid


async def test_a_dead_target_is_removed_on_the_primary(
    primary_url: str, redis_url: str, receiver: Receiver
) -> None:
    stack = replicated_stack(primary_url, redis_url)
    async with running_pipeline(stack, database_read_url=replica_url(primary_url)) as pipe:
        topic, gone = group_topic(), receiver.endpoint(statuses=(410,))
        member = await pipe.member(gone, topic)
        await replicated()
        await hinted(pipe, topic, 1)

        async def forgotten() -> bool:
            return await pipe.recipient(member.rid) is None

        # The deletion is a write: on the replica it would fail ("read-only transaction") and the
        # recipient would stay.
        for _ in range(300):
            if await forgotten():
                break
            await asyncio.sleep(0.05)
        assert await forgotten(), "the dead target was not removed from the primary"
        assert len(gone.hints()) >= 1


def test_a_sqlite_url_is_refused_naming_the_setting() -> None:
    for values in (
        {
            "database_url": "postgresql+asyncpg://postgres@127.0.0.1/db",
            "database_read_url": "sqlite+aiosqlite:///r.db",
        },
        {
            "database_url": "sqlite+aiosqlite:///p.db",
            "database_read_url": "postgresql+asyncpg://postgres@127.0.0.1/db",
        },
    ):
        with pytest.raises(SettingsError) as refused:
            load_settings(**values)
        assert "XMTP_PUSH_DATABASE_READ_URL: " in str(refused.value)
        assert "r.db" not in str(refused.value) and "127.0.0.1" not in str(refused.value)


async def test_config_check_reports_the_replica(primary_url: str) -> None:
    await replicated()
    ok = await xmtp_push(
        "config", "check", env=channel_env(primary_url, database_read_url=replica_url(primary_url))
    )
    (line,) = [line for line in ok.stdout.splitlines() if line.split()[1:2] == ["replica"]]
    assert ok.returncode == 0 and line.startswith("ok") and "in recovery (a replica)" in line, ok

    port = free_port()  # nothing listens there
    unreachable = f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:{port}/db"
    down = await xmtp_push("config", "check", env=channel_env(primary_url, database_read_url=unreachable))
    assert down.returncode == failures.DATABASE_UNREACHABLE, down
    (line,) = [line for line in down.stdout.splitlines() if line.startswith("FAIL")]
    assert line.startswith("FAIL replica"), down
    assert line.endswith("XMTP_PUSH_DATABASE_READ_URL: the read replica is unreachable (connection refused)")
    assert (
        str(port) not in down.stdout + down.stderr
        and PASSWORD not in down.stdout + down.stderr
        and "Traceback" not in down.stderr
    )


STARTUP_LINE = re.compile(r"XMTP_PUSH_DATABASE_READ_URL: .*")


async def test_a_worker_is_ready_only_with_its_replica_and_the_api_without(
    primary_url: str, redis_url: str
) -> None:
    """Real `xmtp-push worker` and `api` processes: the worker reads from the replica, so an unreachable
    one is named in one start-up line and fails its /readyz; the API only writes, so it stays ready."""
    await replicated()
    unreachable = f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:{free_port()}/db"
    for read_url, ready in ((replica_url(primary_url), True), (unreachable, False)):
        env = channel_env(primary_url, redis_url=redis_url, metrics_port="0", database_read_url=read_url)
        async with child("worker", ["worker"], env) as worker:
            port = await worker.probe_port()
            answer = (await wait_answering(f"http://127.0.0.1:{port}/readyz")).json()
            assert answer["checks"]["replica"] == ("ok" if ready else "unavailable"), worker.output()
            if not ready:
                logged = json.loads((await worker.line(STARTUP_LINE)).string)
                assert logged["level"] == "warning", logged
                assert logged["event"] == (
                    "XMTP_PUSH_DATABASE_READ_URL: the read replica is unreachable (connection refused);"
                    " not ready until it answers"
                )
                assert PASSWORD not in "\n".join(worker.lines)
            assert await worker.stop() == 0, worker.output()
    env = channel_env(
        primary_url, redis_url=redis_url, http_port="0", grpc_port="0", database_read_url=unreachable
    )
    async with child("api", ["api"], env) as api:
        http_port = int((await api.line(re.compile(r"serving http=\S*:(\d+)"))).group(1))
        answer = (await wait_answering(f"http://127.0.0.1:{http_port}/readyz")).json()
        assert answer == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}, api.output()
        assert await api.stop() == 0, api.output()


async def test_the_api_checks_the_replica_only_where_it_fans_out_too(primary_url: str) -> None:
    """`api` only writes; `dev` runs the workers in the same process, so its readiness needs the replica."""
    settings = make_settings(primary_url, database_read_url=replica_url(primary_url))
    async with open_runtime(settings) as runtime:
        assert set(create_app(runtime).state.probes.checks) == {"database"}
        probes = create_app(runtime, reads_replica=True).state.probes
        assert set(probes.checks) == {"database", "replica"}
        assert await probes.readiness() == {"database": "ok", "replica": "ok"}
