"""A database that refuses connections is an outage, not a bug: UNAVAILABLE, no stack, quick recovery.

PostgreSQL is made to refuse connections the way operators meet it (ALLOW_CONNECTIONS false, the
live connections terminated, as in a failover). Every RPC over gRPC and Connect answers
UNAVAILABLE (HTTP 503), the outage is logged in one warning naming the setting (not one per call)
and without a stack, and the first call after the database returns succeeds (pooled connections are checked before use).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from app.core.database import is_unavailable
from tests.support import (
    POSTGRES_ADMIN_DSN,
    Api,
    create_postgres_database,
    drop_postgres_database,
    make_settings,
    running,
)
from tests.support.builders import Failure, call, new_creds, register
from tests.support.legacy import Refused, legacy_call, register_request

UNAVAILABLE = Failure("unavailable", "service is unavailable")


async def admin(sql: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def refuse_connections(name: str, refuse: bool) -> None:
    await admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"false" if refuse else "true"}')
    if refuse:
        await admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


@pytest.fixture
async def postgres_api() -> AsyncIterator[tuple[Api, str]]:
    url = await create_postgres_database()
    try:
        async with running(make_settings(url)) as api:
            yield api, url.rsplit("/", 1)[1]
    finally:
        await refuse_connections(url.rsplit("/", 1)[1], refuse=False)
        await drop_postgres_database(url)


@pytest.mark.parametrize("transport", ["grpc", "json"])
async def test_refused_connections_answer_unavailable_and_the_first_call_after_succeeds(
    postgres_api: tuple[Api, str], transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    api, name = postgres_api
    assert not isinstance(await call(api, transport, register(new_creds())), Failure)
    await refuse_connections(name, refuse=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert await call(api, transport, register(new_creds())) == UNAVAILABLE
        # One line for the outage, not one per call: it names the setting and what is wrong.
        told = [r.getMessage() for r in caplog.records if r.name.startswith("app")]
        assert told == [
            "XMTP_PUSH_DATABASE_URL: the database does not accept connections now; "
            "calls answer UNAVAILABLE until it serves"
        ]
        assert all(r.exc_info is None for r in caplog.records)
        await refuse_connections(name, refuse=False)
        assert not isinstance(await call(api, transport, register(new_creds())), Failure)
        told = [r.getMessage() for r in caplog.records if r.name.startswith("app")]
    assert told[1:] == ["XMTP_PUSH_DATABASE_URL: the database answers again"]


def test_outage_states_are_told_from_bugs() -> None:
    class Orig(Exception):
        def __init__(self, sqlstate: str) -> None:
            self.sqlstate = sqlstate

    def dbapi(sqlstate: str) -> sa_exc.DBAPIError:
        return sa_exc.DBAPIError("SELECT 1", None, Orig(sqlstate))

    for state in ("08006", "53300", "57P03", "57P01", "55000"):
        assert is_unavailable(dbapi(state)), state
    for state in ("23505", "42601", "22P02", ""):
        assert not is_unavailable(dbapi(state)), state
    assert is_unavailable(ConnectionRefusedError()) and is_unavailable(sa_exc.TimeoutError())
    assert not is_unavailable(ValueError())


@pytest.mark.slow
async def test_a_database_that_accepts_and_never_answers_is_unavailable_within_the_connect_timeout() -> None:
    """A PostgreSQL address that takes the connection and then says nothing (a hung server, a
    black-holing proxy): the call answers UNAVAILABLE once the connect timeout passes."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    settings = make_settings(
        f"postgresql+asyncpg://postgres@127.0.0.1:{port}/test", database_connect_timeout_seconds=1.0
    )
    try:
        async with running(settings, clear=False) as api:
            started = asyncio.get_running_loop().time()
            assert await call(api, "grpc", register(new_creds())) == UNAVAILABLE
            assert asyncio.get_running_loop().time() - started < 5  # not the 30 s request bound
    finally:
        for writer in held:
            writer.close()
        silent.close()


@pytest.mark.parametrize("transport", ["grpc", "json", "proto"])
async def test_the_legacy_api_answers_unavailable_too(transport: str) -> None:
    """docs/legacy.md#answers-and-errors, row 7: never database text, the contract's constant."""
    url = await create_postgres_database()
    name = url.rsplit("/", 1)[1]
    try:
        settings = make_settings(url, legacy_api_enabled=True)
        async with running(settings) as api:
            assert not isinstance(await legacy_call(api, transport, register_request("i")), Refused)
            await refuse_connections(name, refuse=True)
            refused = await legacy_call(api, transport, register_request("j"))
            assert isinstance(refused, Refused)
            assert (refused.code, refused.message) == ("unavailable", "service is unavailable")
            assert refused.status in (0, 503)
            await refuse_connections(name, refuse=False)
            assert not isinstance(await legacy_call(api, transport, register_request("k")), Refused)
    finally:
        await refuse_connections(name, refuse=False)
        await drop_postgres_database(url)
