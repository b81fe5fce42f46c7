"""Engine and session factory; the declarative base for every model."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase

from app.core.config import MAX_CALL_SECONDS, Settings

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


# SQLSTATEs that say the database cannot serve now, whatever the statement: connection exceptions
# (class 08), insufficient resources (53: too many clients, out of memory or disk), the server
# shutting down or starting up (57P01..57P05), and a database not accepting connections (55000,
# ALLOW_CONNECTIONS false; our statements meet 55000 in no other way).
UNAVAILABLE_STATES = ("08", "53", "57P01", "57P02", "57P03", "57P04", "57P05", "55000")
_UNAVAILABLE_TYPES = (
    OSError,
    TimeoutError,
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
)


def is_unavailable(error: BaseException) -> bool:
    """Whether an error means the database cannot be reached or used now (an outage, not a bug)."""
    if isinstance(error, _UNAVAILABLE_TYPES):
        return True
    if isinstance(error, sa_exc.DBAPIError):
        state = getattr(error.orig, "sqlstate", None) or ""
        return error.connection_invalidated or state.startswith(UNAVAILABLE_STATES)
    return False


class SqliteFolderMissing(Exception):
    """The folder of the configured SQLite file does not exist."""


def _sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for another database, memory, or a `file:` URI."""
    database = make_url(url).database or ""
    a_file = (
        url.startswith("sqlite") and database not in ("", ":memory:") and not database.startswith("file:")
    )
    return Path(database) if a_file else None


def prepare_sqlite_file(url: str) -> None:
    """Refuse a SQLite file whose folder is missing before aiosqlite tries it: its connection thread
    then reports the failure a second time, as a traceback, after the event loop has closed. A file
    not there yet is created readable by its owner alone (it holds webhook signing keys), rather
    than by SQLite with the umask's mode; its journal and write-ahead log take its mode."""
    path = _sqlite_file(url)
    if path is None:
        return
    if not path.parent.is_dir():
        raise SqliteFolderMissing("the folder of the SQLite file does not exist")
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def create_engine(settings: Settings) -> AsyncEngine:
    if settings.is_sqlite:
        prepare_sqlite_file(settings.database_url)
        return _sqlite_engine(settings.database_url)
    return _postgres_engine(settings.database_url, settings)


def create_read_engine(settings: Settings) -> AsyncEngine | None:
    """The read replica's engine (XMTP_PUSH_DATABASE_READ_URL), or None when reads share the primary's."""
    if settings.database_read_url is None:
        return None
    return _postgres_engine(settings.database_read_url, settings)


def _postgres_engine(url: str, settings: Settings) -> AsyncEngine:
    return create_async_engine(
        url,
        pool_size=20,
        max_overflow=10,
        pool_timeout=MAX_CALL_SECONDS,
        # A pooled connection is checked before use: after an outage, stale ones are replaced
        # instead of failing the first work.
        pool_pre_ping=True,
        connect_args={
            "timeout": settings.database_connect_timeout_seconds,
            "command_timeout": MAX_CALL_SECONDS,
        },
    )


def _sqlite_engine(url: str) -> AsyncEngine:
    # SQLite allows one writer at a time. One pooled connection serialises
    # every transaction of this process, so writers never see "database is
    # locked"; the embedded default is a single process (`xmtp-push dev`).
    engine = create_async_engine(
        url, pool_size=1, max_overflow=0, pool_timeout=MAX_CALL_SECONDS, connect_args={"timeout": 30}
    )
    event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def create_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


async def fetch_rows(session: AsyncSession, statement: Any, parameters: Mapping[str, Any]) -> Sequence[Any]:
    """The rows of one read-only statement, for the hot paths that run one per envelope or per batch
    of deliveries. On asyncpg the statement, compiled once, goes straight to the driver (which keeps
    it prepared): SQLAlchemy's async execution layer costs several times the query's own round trip
    there. Elsewhere it is an ordinary execution. Rows are tuples in the statement's column order.
    Not for use inside a transaction that has written: the driver call does not join it."""
    connection = await session.connection()
    if connection.dialect.driver != "asyncpg":
        return (await connection.execute(statement, dict(parameters))).all()
    sql, names = _driver_sql(statement, connection.dialect)
    raw = await connection.get_raw_connection()
    driver: Any = raw.driver_connection
    try:
        return list(await driver.fetch(sql, *(parameters[name] for name in names)))
    except Exception:
        # SQLAlchemy did not see this error, so it cannot tell a lost connection from a bad query:
        # drop the connection from the pool rather than hand a possibly dead one to the next user.
        await connection.invalidate()
        raise


@functools.cache
def _driver_sql(statement: Any, dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    compiled = statement.compile(dialect=dialect)
    return str(compiled), tuple(compiled.positiontup or ())


def upsert_insert(session: AsyncSession, model: Any) -> Any:
    """INSERT with ON CONFLICT support for the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)
