"""Reading the Go reference server's PostgreSQL database for `xmtp-push legacy import`
(docs/legacy.md#importing-the-go-servers-data).

Either schema generation: `subscriptions.topic` is TEXT (the legacy string) before the Go server's
2026 migration and BYTEA (kind byte + identifier) after it; the column's type says which. Older
databases may lack `subscriptions.is_silent` and `subscription_hmac_keys` (both came in 2024).
Everything is read in one read-only, repeatable-read transaction, so the tables are seen as of one
moment, and streamed in batches through a server-side cursor: memory stays bounded whatever the
row count. Each row becomes one of our values or the reason it is skipped; nothing read is logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.legacy import topics
from app.legacy.commands import (
    ImportedInstallation,
    ImportedKey,
    ImportedSubscription,
    Mechanism,
    MechanismKind,
)
from app.legacy.service import MAX_INSTALLATION_ID_CHARS, MAX_KEY_BYTES, MAX_TOKEN_CHARS

BATCH_ROWS = 1000
SCHEMES = ("postgres", "postgresql", "postgresql+asyncpg")
# Why a row is not imported (printed as counts; the rows themselves never are).
UNUSABLE_ID = "with an installation id the API refuses"
NOT_A_LEGACY_TOPIC = "with a topic of neither legacy form (never pushed)"
UNUSABLE_KEY = "empty, over 64 bytes or of a negative period"
OF_A_SKIPPED_SUBSCRIPTION = "of a skipped subscription"
_KINDS = {kind.label: kind for kind in MechanismKind}
T = TypeVar("T")


class SourceFailed(Exception):
    """An error met on the Go server's database; its cause says what (the command names `--from`)."""


class NotAGoDatabase(Exception):
    """The database holds no tables of the Go notification server."""

    def __init__(self) -> None:
        super().__init__(
            "the database holds no tables of the Go notification server "
            "(installations, device_delivery_mechanisms, subscriptions)"
        )


class UnusableSourceUrl(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class GoSchema:
    binary_topics: bool  # subscriptions.topic is BYTEA (the 2026 generation)
    has_silence: bool  # subscriptions.is_silent exists
    has_keys: bool  # subscription_hmac_keys exists


def source_url(url: str) -> str:
    """The --from URL as SQLAlchemy's asyncpg URL; the error never holds the URL (a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it validates it
    except ValueError:
        raise UnusableSourceUrl("not a well-formed URL") from None
    if parts.scheme not in SCHEMES or not parts.path.strip("/"):
        raise UnusableSourceUrl("a postgresql:// URL naming a database is expected")
    return "postgresql+asyncpg" + url[len(parts.scheme) :]


class GoDatabase:
    """The Go server's tables, read inside one read-only transaction."""

    def __init__(self, connection: AsyncConnection, schema: GoSchema) -> None:
        self._connection = connection
        self.schema = schema

    def installations(self) -> AsyncIterator[list[ImportedInstallation | str]]:
        return self._batches(_INSTALLATIONS, installation_of)

    def subscriptions(self) -> AsyncIterator[list[ImportedSubscription | str]]:
        silence = "COALESCE(is_silent, FALSE)" if self.schema.has_silence else "FALSE"
        query = f"SELECT installation_id, topic, COALESCE(is_active, FALSE), {silence} FROM subscriptions"  # noqa: S608 - constant text
        return self._batches(query, subscription_of)

    async def keys(self) -> AsyncIterator[list[ImportedKey | str]]:
        if not self.schema.has_keys:
            return
        async for batch in self._batches(_KEYS, key_of):
            yield batch

    async def _batches(self, query: str, convert: Callable[[Sequence[Any]], T]) -> AsyncIterator[list[T]]:
        try:
            result = await self._connection.stream(text(query))
            async for rows in result.partitions(BATCH_ROWS):
                yield [convert(row) for row in rows]
        except Exception as error:
            raise SourceFailed from error


@asynccontextmanager
async def open_go_database(url: str, connect_timeout_seconds: float) -> AsyncIterator[GoDatabase]:
    """The Go server's database at `url` (see source_url), read-only, as of one moment."""
    engine = create_async_engine(
        source_url(url), pool_size=1, connect_args={"timeout": connect_timeout_seconds}
    )
    try:
        async with _read_only(engine) as connection:
            yield GoDatabase(connection, await _schema(connection))
    finally:
        await engine.dispose()


@asynccontextmanager
async def _read_only(engine: Any) -> AsyncIterator[AsyncConnection]:
    try:
        connection = await engine.connect()
        options = {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}
        connection = await connection.execution_options(**options)
        transaction = await connection.begin()
    except Exception as error:
        raise SourceFailed from error
    try:
        yield connection
    finally:
        # It wrote nothing: a rollback ends it as a commit would. A connection lost meanwhile has
        # already been told as the failure it is; its cleanup failing too says nothing more.
        with suppress(Exception):
            await transaction.rollback()
        with suppress(Exception):
            await connection.close()


_COLUMNS = """
SELECT table_name, column_name, data_type FROM information_schema.columns
WHERE table_schema = current_schema()
  AND table_name IN ('installations', 'device_delivery_mechanisms', 'subscriptions', 'subscription_hmac_keys')
"""


async def _schema(connection: AsyncConnection) -> GoSchema:
    try:
        rows = (await connection.execute(text(_COLUMNS))).all()
    except Exception as error:
        raise SourceFailed from error
    columns = {(table, column): data_type for table, column, data_type in rows}
    topic_type = columns.get(("subscriptions", "topic"))
    needed = (("installations", "id"), ("device_delivery_mechanisms", "token"))
    if topic_type not in ("text", "bytea") or not all(name in columns for name in needed):
        raise NotAGoDatabase
    return GoSchema(
        binary_topics=topic_type == "bytea",
        has_silence=("subscriptions", "is_silent") in columns,
        has_keys=("subscription_hmac_keys", "key") in columns,
    )


# The newest mechanism of each installation (updated_at, then id), as the Go server chose it.
_INSTALLATIONS = """
SELECT i.id, i.deleted_at IS NOT NULL, m.kind, m.token
FROM installations i
LEFT JOIN LATERAL (
    SELECT d.kind, d.token FROM device_delivery_mechanisms d
    WHERE d.installation_id = i.id
    ORDER BY d.updated_at DESC NULLS LAST, d.id DESC
    LIMIT 1
) m ON TRUE
"""
_KEYS = """
SELECT s.installation_id, s.topic, k.thirty_day_periods_since_epoch, k.key
FROM subscription_hmac_keys k JOIN subscriptions s ON s.id = k.subscription_id
"""


def installation_of(row: Sequence[Any]) -> ImportedInstallation | str:
    installation_id, deleted, kind, token = row
    if not usable_id(installation_id):
        return UNUSABLE_ID
    return ImportedInstallation(installation_id, mechanism_of(kind, token), bool(deleted))


def mechanism_of(kind: str | None, token: str | None) -> Mechanism | None:
    """The mechanism a Go row names, or None for one nothing can be pushed to (an fcm row with an
    empty token is how the Go server stored none) or that RegisterInstallation would refuse."""
    known = _KINDS.get(kind or "")
    if known is None or not token or len(token) > MAX_TOKEN_CHARS or "\x00" in token:
        return None
    return Mechanism(known, token)


def subscription_of(row: Sequence[Any]) -> ImportedSubscription | str:
    installation_id, topic, active, silent = row
    if not usable_id(installation_id):
        return UNUSABLE_ID
    name = legacy_topic(topic)
    if name is None:
        return NOT_A_LEGACY_TOPIC
    return ImportedSubscription(installation_id, name, bool(active), bool(silent))


def key_of(row: Sequence[Any]) -> ImportedKey | str:
    installation_id, topic, period, key = row
    name = legacy_topic(topic)
    if not usable_id(installation_id) or name is None:
        return OF_A_SKIPPED_SUBSCRIPTION
    if not key or len(key) > MAX_KEY_BYTES or not 0 <= period < 2**31:
        return UNUSABLE_KEY
    return ImportedKey(installation_id, name, period, bytes(key))


def legacy_topic(topic: str | bytes | None) -> str | None:
    """The legacy string of a stored topic, TEXT or BYTEA; None for one of neither legacy form,
    which the Go server could never push to (it matched envelopes' topics exactly)."""
    if isinstance(topic, str):
        return topic if topics.to_bytes(topic) is not None else None
    return topics.to_string(bytes(topic)) if topic is not None else None


def usable_id(installation_id: str | None) -> bool:
    """An id RegisterInstallation would take (app.legacy.service.check_installation_id)."""
    if installation_id is None:
        return False
    return 0 < len(installation_id) <= MAX_INSTALLATION_ID_CHARS and "\x00" not in installation_id
