"""The PostgreSQL streaming replica of the read-replica tests.

It replicates the whole primary (tests/support/__init__.py's POSTGRES_ADMIN_DSN), so a database a test
creates there reaches the replica by streaming replication, under the same name. `make pg-replica`
(.ci/pg-replica) starts it; the tests stop and start it through the same script.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.support import POSTGRES_ADMIN_DSN, eventually

REPLICA_ADMIN_DSN = os.environ.get(
    "XMTP_PUSH_TEST_POSTGRES_REPLICA", "postgresql://postgres@127.0.0.1:5433/postgres"
)
SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "pg-replica"
REPLICATION_SECONDS = 30.0


def _port() -> int:
    return urlsplit(REPLICA_ADMIN_DSN).port or 5432


async def require_replica() -> None:
    """Fails the test in one line when no streaming replica answers where the tests look for one."""
    where = f"127.0.0.1:{_port()} (XMTP_PUSH_TEST_POSTGRES_REPLICA)"
    connection = None
    with contextlib.suppress(OSError, asyncpg.PostgresError):
        connection = await asyncpg.connect(REPLICA_ADMIN_DSN, timeout=5)
    if connection is None:  # failed here, not in the except block: one line, no chained traceback
        pytest.fail(
            f"no PostgreSQL streaming replica answers at {where}: `make pg-replica` starts one", False
        )
    try:
        recovering = await connection.fetchval("SELECT pg_is_in_recovery()")
    finally:
        await connection.close()
    if not recovering:
        pytest.fail(
            f"PostgreSQL at {where} is not a replica (not in recovery): `make pg-replica` makes one", False
        )


def replica_url(primary_url: str) -> str:
    """The SQLAlchemy URL of a primary's database on the replica: the same name, the replica's address."""
    name = primary_url.rsplit("/", 1)[1]
    base = REPLICA_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return f"{base}/{name}"


async def replicated() -> None:
    """Wait until the replica has replayed everything the primary has written so far."""
    primary = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        written = await primary.fetchval("SELECT pg_current_wal_lsn()")
    finally:
        await primary.close()
    replica = await asyncpg.connect(REPLICA_ADMIN_DSN)
    try:

        async def caught_up() -> bool:
            return bool(await replica.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", written))

        await eventually(caught_up, REPLICATION_SECONDS, "the replica to replay the primary's writes")
    finally:
        await replica.close()


async def sessions_on_replica(primary_url: str) -> int:
    """The connections open on the replica to a primary's database (the product's, not the tests')."""
    replica = await asyncpg.connect(REPLICA_ADMIN_DSN)
    try:
        count = await replica.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", primary_url.rsplit("/", 1)[1]
        )
    finally:
        await replica.close()
    return int(count)


async def replica_service(action: str) -> None:
    """`stop` or `start` the replica with the script that made it."""
    primary = urlsplit(POSTGRES_ADMIN_DSN)
    where = {"PG_PRIMARY_HOST": primary.hostname or "127.0.0.1", "PG_PRIMARY_PORT": str(primary.port or 5432)}
    process = await asyncio.create_subprocess_exec(
        str(SCRIPT),
        action,
        str(_port()),
        env={**os.environ, **where},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, output.decode()
