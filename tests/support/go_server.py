"""A PostgreSQL database holding the Go reference server's tables (example-notification-server-go), as
its migrations made them in either generation (docs/legacy.md#importing-the-go-servers-data), with
rows that exercise every rule of the import."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.support import create_empty_postgres_database, drop_postgres_database
from tests.support.legacy import group, welcome

TEXT_TOPICS, BINARY_TOPICS = "text", "bytea"
GENERATIONS = (TEXT_TOPICS, BINARY_TOPICS)
# Trust authentication ignores it; it is there to show that no output repeats it.
PASSWORD = "go-pw-" + secrets.token_hex(6)

_TABLES = """
CREATE TABLE installations (
    id TEXT PRIMARY KEY,
    created_at TIMESTAMPTZ DEFAULT NOW(),
    deleted_at TIMESTAMPTZ
);
CREATE TABLE device_delivery_mechanisms (
    id SERIAL PRIMARY KEY,
    installation_id TEXT REFERENCES installations(id) NOT NULL,
    created_at TIMESTAMPTZ DEFAULT NOW(),
    updated_at TIMESTAMPTZ DEFAULT NOW(),
    kind TEXT NOT NULL,
    token TEXT NOT NULL,
    UNIQUE (installation_id, kind, token)
);
CREATE INDEX device_delivery_mechanisms_installation_id_idx ON device_delivery_mechanisms (installation_id);
CREATE TABLE subscriptions (
    id SERIAL PRIMARY KEY,
    installation_id TEXT NOT NULL,
    created_at TIMESTAMPTZ DEFAULT NOW(),
    topic {topic_type} NOT NULL,
    is_active BOOLEAN,
    is_silent BOOLEAN DEFAULT FALSE
);
CREATE INDEX subscriptions_topic_is_active_idx ON subscriptions (topic, is_active);
CREATE UNIQUE INDEX subscriptions_installation_id_topic_idx ON subscriptions (installation_id, topic);
CREATE TABLE subscription_hmac_keys (
    subscription_id INTEGER NOT NULL,
    thirty_day_periods_since_epoch INTEGER NOT NULL,
    created_at TIMESTAMPTZ DEFAULT NOW(),
    updated_at TIMESTAMPTZ DEFAULT NOW(),
    key BYTEA NOT NULL,
    PRIMARY KEY (subscription_id, thirty_day_periods_since_epoch),
    FOREIGN KEY (subscription_id) REFERENCES subscriptions(id) ON DELETE CASCADE
);
"""
# The 2026 generation also gave installations a payload format (1 = v3).
_PAYLOAD_FORMAT = "ALTER TABLE installations ADD COLUMN payload_format SMALLINT NOT NULL DEFAULT 1"

T0 = datetime(2025, 3, 1, tzinfo=UTC)
LONG_ID = "i" * 300  # over the API's 256 characters
NOT_LEGACY = "/xmtp/0/invite-0123/proto"  # TEXT generation; the BYTEA one stores kind 2
KEY = {670: b"\x01" * 32, 671: b"\x02" * 32, 672: b"\x03" * 32}


@dataclass(frozen=True)
class Mechanism:
    installation_id: str
    kind: str
    token: str
    updated_minutes: int  # after T0


# installation id -> deleted
INSTALLATIONS = {
    "ios-1": False,
    "android-1": False,
    "android-empty": False,
    "deleted-1": True,
    "bare-1": False,
    LONG_ID: False,
}
MECHANISMS = (
    Mechanism("ios-1", "fcm", "fcm-token-ios-before", 1),
    Mechanism("ios-1", "apns", "apns-token-ios-old", 2),
    Mechanism("ios-1", "apns", "apns-token-ios-new", 3),  # the newest: its mechanism
    Mechanism("android-1", "fcm", "fcm-token-android-a", 5),
    Mechanism("android-1", "fcm", "fcm-token-android-b", 5),  # as new, a higher id: its mechanism
    Mechanism("android-empty", "fcm", "fcm-token-android-once", 1),
    Mechanism("android-empty", "fcm", "", 2),  # the newest is empty: no mechanism
    Mechanism("deleted-1", "apns", "apns-token-deleted", 1),
    Mechanism(LONG_ID, "apns", "apns-token-long", 1),
)


@dataclass(frozen=True)
class Subscription:
    installation_id: str
    topic: str  # the legacy string, or NOT_LEGACY
    is_active: bool | None
    is_silent: bool = False
    keys: tuple[int, ...] = ()  # periods of KEY
    bad_keys: tuple[bytes, ...] = ()  # stored under periods 700, 701, ...


SUBSCRIPTIONS = (
    Subscription("ios-1", group(1), True, keys=(670, 671)),
    Subscription("ios-1", welcome(1), True, is_silent=True),
    Subscription("ios-1", group(2), False, keys=(671,)),
    Subscription("ios-1", NOT_LEGACY, True, keys=(671,)),
    Subscription("android-1", group(1), True, keys=(671, 672)),
    Subscription("android-1", group(3), True, is_silent=True, bad_keys=(b"", b"k" * 65)),
    Subscription("android-1", group(4), None),  # NULL: not active
    Subscription("android-empty", group(1), True),
    Subscription("deleted-1", group(1), True, keys=(671,)),
    Subscription("deleted-1", group(2), True),
    Subscription("bare-1", group(2), True),
    Subscription("never-registered", group(1), True),
    Subscription(LONG_ID, group(1), True, keys=(671,)),
)


def stored_topic(topic: str, generation: str) -> str | bytes:
    if generation == TEXT_TOPICS:
        return topic
    if topic == NOT_LEGACY:
        return b"\x02" + b"\x07" * 16
    kind = b"\x00" if "/g-" in topic else b"\x01"
    return kind + bytes.fromhex(topic.split("-", 1)[1].removesuffix("/proto"))


async def _fill(connection: asyncpg.Connection, generation: str) -> None:
    topic_type = "TEXT" if generation == TEXT_TOPICS else "BYTEA"
    await connection.execute(_TABLES.replace("{topic_type}", topic_type))
    if generation == BINARY_TOPICS:
        await connection.execute(_PAYLOAD_FORMAT)
    for installation_id, deleted in INSTALLATIONS.items():
        await connection.execute(
            "INSERT INTO installations (id, deleted_at) VALUES ($1, $2)",
            installation_id,
            T0 + timedelta(days=9) if deleted else None,
        )
    for m in MECHANISMS:
        await connection.execute(
            "INSERT INTO device_delivery_mechanisms (installation_id, kind, token, updated_at) VALUES ($1, $2, $3, $4)",
            m.installation_id,
            m.kind,
            m.token,
            T0 + timedelta(minutes=m.updated_minutes),
        )
    for s in SUBSCRIPTIONS:
        subscription_id = await connection.fetchval(
            "INSERT INTO subscriptions (installation_id, topic, is_active, is_silent) VALUES ($1, $2, $3, $4) RETURNING id",
            s.installation_id,
            stored_topic(s.topic, generation),
            s.is_active,
            s.is_silent,
        )
        keys = [(p, KEY[p]) for p in s.keys] + [(700 + n, k) for n, k in enumerate(s.bad_keys)]
        for period, key in keys:
            await connection.execute(
                "INSERT INTO subscription_hmac_keys (subscription_id, thirty_day_periods_since_epoch, key) VALUES ($1, $2, $3)",
                subscription_id,
                period,
                key,
            )


@asynccontextmanager
async def go_server_database(generation: str) -> AsyncIterator[str]:
    """A database of the Go server's tables and rows; yields its postgresql:// URL (with a password)."""
    created = await create_empty_postgres_database("go_notifications")
    server, name = created.split("@")[-1].rsplit("/", 1)
    url = f"postgresql://postgres:{PASSWORD}@{server}/{name}"
    try:
        connection = await asyncpg.connect(url)
        try:
            await _fill(connection, generation)
        finally:
            await connection.close()
        yield url
    finally:
        await drop_postgres_database(created)


# What the Go server pushed an envelope of a topic to: active subscriptions of installations not
# deleted whose newest mechanism (updated_at, then id) has a token.
GO_RECIPIENTS = """
SELECT s.installation_id FROM subscriptions s
JOIN installations i ON i.id = s.installation_id AND i.deleted_at IS NULL
JOIN LATERAL (
    SELECT d.token FROM device_delivery_mechanisms d WHERE d.installation_id = i.id
    ORDER BY d.updated_at DESC, d.id DESC LIMIT 1
) m ON m.token <> ''
WHERE s.topic = $1 AND s.is_active
ORDER BY s.installation_id
"""


async def go_recipients(url: str, topic: str, generation: str) -> list[str]:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(GO_RECIPIENTS, stored_topic(topic, generation))
    finally:
        await connection.close()
    return [row[0] for row in rows]
