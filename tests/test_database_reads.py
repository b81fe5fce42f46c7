"""The read path that bypasses SQLAlchemy's execution layer (fan-out pages, delivery targets)."""

from __future__ import annotations

import asyncpg
import pytest

from app.recipients import repository as repo
from app.runtime import open_runtime
from tests.support import POSTGRES_ADMIN_DSN, create_postgres_database, drop_postgres_database, make_settings

UNKNOWN = b"\x01" * 32


async def _terminate_connections(database_url: str) -> int:
    admin = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            database_url.rsplit("/", 1)[1],
        )
    finally:
        await admin.close()
    return len(rows)


@pytest.mark.postgres
async def test_a_read_after_a_lost_connection_reconnects_first() -> None:
    url = await create_postgres_database()
    try:
        async with open_runtime(make_settings(url)) as runtime:
            async with runtime.reads() as session:
                assert await repo.targets_by_id(session, [UNKNOWN]) == {}
                assert await repo.subscribers_page(session, b"topic", b"", 10) == []
            assert await _terminate_connections(url) == 1
            # The pool's one connection is dead: it is checked before use and replaced, so the
            # next read succeeds instead of failing once.
            async with runtime.reads() as session:
                assert await repo.targets_by_id(session, [UNKNOWN]) == {}
                assert await repo.subscribers_page(session, b"topic", b"", 10) == []
    finally:
        await drop_postgres_database(url)
