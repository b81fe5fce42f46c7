"""The read path that bypasses SQLAlchemy's execution layer (fan-out pages, delivery targets)."""

from __future__ import annotations

import secrets
import time

import asyncpg
import pytest
from sqlalchemy import text

from app.legacy import repository as legacy_repo
from app.legacy.models import LegacyInstallation
from app.legacy.repository import LegacyTarget
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


async def test_legacy_delivery_targets_are_one_prepared_statement_for_any_number_of_ids(
    database_url: str,
) -> None:
    """A batch of legacy deliveries looks its installations up in one query: only those that may be
    pushed to, and on PostgreSQL one statement the driver keeps prepared whatever the batch's size."""
    run = secrets.token_hex(4)
    alive, deleted, tokenless, expired = (
        f"{run}-{name}" for name in ("alive", "deleted", "tokenless", "expired")
    )
    async with open_runtime(make_settings(database_url)) as runtime:
        now = time.time_ns()
        async with runtime.sessions() as session, session.begin():
            session.add_all(
                [
                    LegacyInstallation(id=alive, kind=1, token="t-alive", registered_ns=now, deleted=False),
                    LegacyInstallation(
                        id=deleted, kind=1, token="t-deleted", registered_ns=now, deleted=True
                    ),
                    LegacyInstallation(id=tokenless, kind=None, token=None, registered_ns=now, deleted=False),
                    LegacyInstallation(
                        id=expired, kind=2, token="t-expired", registered_ns=now - 10**12, deleted=False
                    ),
                ]
            )
        async with runtime.reads() as session:
            found = [
                await legacy_repo.targets(session, ids, now - 10**9)
                for ids in (
                    [alive, deleted, tokenless, expired, f"{run}-unknown", alive],
                    [alive],
                    [alive, expired],
                )
            ]
            assert found == [{alive: LegacyTarget(1, "t-alive")}] * 3
            assert await legacy_repo.targets(session, [], now) == {}
            if database_url.startswith("postgresql"):
                prepared = await session.execute(
                    text(
                        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%FROM legacy_installations%'"
                        " AND statement NOT LIKE '%pg_prepared_statements%'"
                    )
                )
                assert prepared.scalar_one() == 1
