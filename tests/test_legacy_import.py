"""`xmtp-push legacy import` (docs/legacy.md#importing-the-go-servers-data): a database holding the Go
server's tables, in either generation, added to ours; run twice, the second run adds nothing; a dry run
writes nothing; what is here wins; pushes then reach exactly the installations the Go server reached;
the output holds counts only."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from app.core.database import create_engine, create_session_factory
from app.legacy import go_import
from app.legacy import repository as repo
from app.legacy.commands import (
    ImportedInstallation,
    ImportedKey,
    ImportedSubscription,
    Mechanism,
    MechanismKind,
)
from app.legacy.importing import OF_A_SUBSCRIPTION_OVER_THE_LIMIT, OVER_TOPIC_LIMIT, ImportReport, Tally
from app.ops import failures
from app.ops.legacy_import import format_report, import_go_database
from tests.support import (
    create_postgres_database,
    create_sqlite_database,
    drop_postgres_database,
    make_settings,
)
from tests.support.cli import run
from tests.support.go_server import (
    BINARY_TOPICS,
    GENERATIONS,
    KEY,
    LONG_ID,
    MECHANISMS,
    NOT_LEGACY,
    PASSWORD,
    SUBSCRIPTIONS,
    go_recipients,
    go_server_database,
)
from tests.support.legacy import group, welcome
from tests.support.ops import child_env, free_port

TOPICS = (group(1), group(2), group(3), group(4), welcome(1))
APNS, FCM = int(MechanismKind.APNS), int(MechanismKind.FCM)
# (id, kind, token, deleted) of each installation the import adds, whichever the generation.
INSTALLATIONS = [
    ("android-1", FCM, "fcm-token-android-b", False),
    ("android-empty", None, None, False),
    ("bare-1", None, None, False),
    ("deleted-1", APNS, "apns-token-deleted", True),
    ("ios-1", APNS, "apns-token-ios-new", False),
]
# (installation id, topic, active, silent)
SUBSCRIBED = sorted(
    (s.installation_id, s.topic, bool(s.is_active), s.is_silent)
    for s in SUBSCRIPTIONS
    if s.installation_id != LONG_ID and s.topic != NOT_LEGACY
)
KEYS = sorted(
    (s.installation_id, s.topic, period, KEY[period])
    for s in SUBSCRIPTIONS
    if s.installation_id != LONG_ID and s.topic != NOT_LEGACY
    for period in s.keys
)
REPORT = [
    "installations: 5 imported (1 deleted, 2 without a delivery mechanism); "
    "skipped: 1 with an installation id the API refuses",
    "subscriptions: 11 imported (2 inactive, 2 silent); skipped: 1 with a topic of neither legacy form "
    "(never pushed), 1 with an installation id the API refuses",
    "HMAC keys: 6 imported; skipped: 2 empty, over 64 bytes or of a negative period, "
    "2 of a skipped subscription",
]
AGAIN = [
    "installations: 0 imported; skipped: 5 already here, 1 with an installation id the API refuses",
    "subscriptions: 0 imported; skipped: 11 already here, 1 with a topic of neither legacy form "
    "(never pushed), 1 with an installation id the API refuses",
    "HMAC keys: 0 imported; skipped: 6 already here, 2 empty, over 64 bytes or of a negative period, "
    "2 of a skipped subscription",
]


@pytest.fixture
async def fresh_postgres() -> AsyncIterator[str]:
    """A migrated PostgreSQL database of this test's own (the session's is shared)."""
    url = await create_postgres_database()
    yield url
    await drop_postgres_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
async def our_database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A migrated database of this test's own, SQLite or PostgreSQL."""
    if request.param == "sqlite":
        yield await create_sqlite_database(tmp_path)
        return
    url = await create_postgres_database()
    yield url
    await drop_postgres_database(url)


@pytest.fixture(params=GENERATIONS)
async def go_database(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    """(URL, generation) of a database of the Go server's tables, topics TEXT or BYTEA."""
    async with go_server_database(request.param) as url:
        yield url, request.param


async def stored(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = {
        "installations": "SELECT id, kind, token, deleted, registered_ns FROM legacy_installations",
        "subscriptions": "SELECT installation_id, topic, active, is_silent, created_ns FROM legacy_subscriptions",
        "keys": "SELECT installation_id, topic, period, key FROM legacy_hmac_keys",
    }
    engine = create_engine(make_settings(database_url))
    try:
        async with engine.connect() as connection:
            return {
                name: sorted(tuple(row) for row in await connection.execute(text(sql)))
                for name, sql in tables.items()
            }
    finally:
        await engine.dispose()


async def xmtp_push_import(
    tmp_path: Path, database_url: str, source: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = child_env(database_url=database_url, log_level="INFO")
    return await asyncio.to_thread(run, ["legacy", "import", "--from", source, *args], env, tmp_path)


def assert_counts_only(result: subprocess.CompletedProcess[str]) -> None:
    """Nothing read is printed: no id, token, topic or key, nor the URL's password."""
    output = result.stdout + result.stderr
    secrets = [PASSWORD, "go_notifications_", LONG_ID[:20], NOT_LEGACY, "/xmtp/mls/"]
    secrets += [m.installation_id for m in MECHANISMS] + [m.token for m in MECHANISMS if m.token]
    secrets += ["never-registered", *(KEY[p].hex() for p in KEY)]
    assert not [s for s in secrets if s in output], output


@pytest.mark.slow
@pytest.mark.postgres
async def test_an_import_adds_what_the_go_server_holds_once(
    tmp_path: Path, fresh_postgres: str, go_database: tuple[str, str]
) -> None:
    source, generation = go_database
    empty = await stored(fresh_postgres)

    dry = await xmtp_push_import(tmp_path, fresh_postgres, source, "--dry-run")
    assert dry.returncode == 0, dry
    assert dry.stdout.splitlines()[1:] == ["dry run: nothing was written; an import now would add:", *REPORT]
    assert await stored(fresh_postgres) == empty
    assert_counts_only(dry)

    before = time.time_ns()
    first = await xmtp_push_import(tmp_path, fresh_postgres, source)
    after = time.time_ns()
    assert first.returncode == 0, first
    words = "binary (2026 and later)" if generation == BINARY_TOPICS else "strings (before 2026)"
    assert first.stdout.splitlines()[0] == f"the Go server's database: topics stored as {words}"
    assert first.stdout.splitlines()[1:4] == REPORT, first.stdout
    assert "expire in 2592000 s" in first.stdout and not first.stderr, first
    assert_counts_only(first)
    rows = await stored(fresh_postgres)
    assert [row[:4] for row in rows["installations"]] == INSTALLATIONS
    imported_at = {row[4] for row in rows["installations"]} | {row[4] for row in rows["subscriptions"]}
    assert len(imported_at) == 1 and before <= imported_at.pop() <= after  # their lifetime starts now
    assert [row[:4] for row in rows["subscriptions"]] == SUBSCRIBED
    assert rows["keys"] == KEYS

    again = await xmtp_push_import(tmp_path, fresh_postgres, source)
    assert again.returncode == 0, again
    assert again.stdout.splitlines()[1:] == AGAIN, again.stdout
    assert await stored(fresh_postgres) == rows
    assert_counts_only(again)


@pytest.mark.slow
@pytest.mark.postgres
async def test_what_is_here_wins(tmp_path: Path, fresh_postgres: str) -> None:
    """An installation registered with us since the switch, and a subscription it ended, stay as
    they are; what is missing is still added."""
    engine = create_engine(make_settings(fresh_postgres))
    try:
        async with create_session_factory(engine)() as session:
            await repo.upsert_installation(session, "ios-1", Mechanism(MechanismKind.APNS, "ours"), 42)
            await repo.add_subscriptions(session, [ImportedSubscription("ios-1", group(1), False, False)], 43)
            await session.commit()
    finally:
        await engine.dispose()
    async with go_server_database(BINARY_TOPICS) as source:
        result = await xmtp_push_import(tmp_path, fresh_postgres, source)
    assert result.returncode == 0, result
    assert result.stdout.splitlines()[1].startswith("installations: 4 imported"), result.stdout
    rows = await stored(fresh_postgres)
    assert ("ios-1", APNS, "ours", False, 42) in rows["installations"]
    assert ("ios-1", group(1), False, False, 43) in rows["subscriptions"]
    assert ("ios-1", welcome(1), True, True) in [row[:4] for row in rows["subscriptions"]]
    assert len(rows["installations"]) == 5 and len(rows["keys"]) == 6


@pytest.mark.slow
async def test_pushes_reach_exactly_the_installations_the_go_server_reached(
    our_database: str, go_database: tuple[str, str]
) -> None:
    source, generation = go_database
    settings = make_settings(our_database)
    report, _ = await import_go_database(settings, source, dry_run=False)
    assert report.installations.imported == 5
    engine = create_engine(settings)
    alive_since = time.time_ns() - settings.legacy_installation_ttl_seconds * 1_000_000_000
    try:
        async with create_session_factory(engine)() as session:
            for topic in TOPICS:
                page = await repo.subscribers_page(session, topic, "", 100, 671, alive_since)
                reached = await go_recipients(source, topic, generation)
                # But for an id over the API's 256 characters, skipped and counted as such: no
                # RegisterInstallation could ever renew it here.
                expected = [i for i in reached if i != LONG_ID]
                assert [row.installation_id for row in page] == expected, topic
            first = await repo.subscribers_page(session, group(1), "", 100, 671, alive_since)
    finally:
        await engine.dispose()
    assert [(row.installation_id, row.key) for row in first] == [("android-1", KEY[671]), ("ios-1", KEY[671])]
    assert LONG_ID in await go_recipients(source, group(1), generation)  # the exception above is real


@pytest.mark.slow
@pytest.mark.postgres
async def test_a_database_of_other_tables_is_refused_in_one_line(tmp_path: Path, fresh_postgres: str) -> None:
    ours_as_source = fresh_postgres.replace("postgresql+asyncpg://", "postgresql://")
    result = await xmtp_push_import(tmp_path, fresh_postgres, ours_as_source)
    assert result.returncode == failures.DATABASE_NOT_MIGRATED, result
    assert result.stderr.startswith("xmtp-push: --from: the database holds no tables of the Go notification")
    assert result.stderr.count("\n") == 1 and not result.stdout, result


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("source", "code", "words"),
    [
        (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{{port}}/x", failures.DATABASE_UNREACHABLE, "refused"),
        (f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/go_nope", failures.DATABASE_MISSING, "not exist"),
        (f"mysql://root:{PASSWORD}@127.0.0.1/x", failures.INVALID_CONFIGURATION, "postgresql://"),
        (f"postgresql://u:{PASSWORD}@host:port/x", failures.INVALID_CONFIGURATION, "not a well-formed URL"),
    ],
    ids=["unreachable", "missing", "other scheme", "malformed"],
)
async def test_a_source_that_cannot_be_read_is_one_line_naming_the_option(
    tmp_path: Path, fresh_postgres: str, source: str, code: int, words: str
) -> None:
    result = await xmtp_push_import(tmp_path, fresh_postgres, source.replace("{port}", str(free_port())))
    shown = f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == code, shown
    assert result.stderr.count("\n") == 1 and "--from: " in result.stderr and words in result.stderr, shown
    assert PASSWORD not in shown and "Traceback" not in shown, shown


# --- the rows, one at a time (no database) ---------------------------------------------------------


def test_the_newest_mechanism_is_kept_unless_nothing_can_be_pushed_to_it() -> None:
    row = ("ios-1", False, "apns", "t")
    assert go_import.installation_of(row) == ImportedInstallation(
        "ios-1", Mechanism(MechanismKind.APNS, "t"), False
    )
    assert go_import.mechanism_of("fcm", "") is None
    assert go_import.mechanism_of("fcm", "f" * 4097) is None
    assert go_import.mechanism_of("sms", "t") is None
    assert go_import.mechanism_of(None, None) is None
    assert go_import.installation_of(("", True, None, None)) == go_import.UNUSABLE_ID
    assert go_import.installation_of(("a\x00b", True, None, None)) == go_import.UNUSABLE_ID


def test_topics_of_either_generation_read_as_their_legacy_string() -> None:
    group_id = bytes(range(16))
    name = f"/xmtp/mls/1/g-{group_id.hex()}/proto"
    assert go_import.legacy_topic(name) == name
    assert go_import.legacy_topic(b"\x00" + group_id) == name
    assert go_import.legacy_topic(memoryview(b"\x01" + b"\xab" * 32)) == welcome(0).replace(
        "0" * 64, "ab" * 32
    )
    for other in (
        name.upper(),
        "/xmtp/0/intro-x/proto",
        b"\x00" + group_id[:15],
        b"\x02" + group_id,
        b"",
        None,
    ):
        assert go_import.legacy_topic(other) is None, other
    assert go_import.subscription_of(("i", b"\x05", True, False)) == go_import.NOT_A_LEGACY_TOPIC


def test_keys_the_api_refuses_are_skipped() -> None:
    topic = b"\x00" + bytes(16)
    assert go_import.key_of(("i", topic, 671, b"k" * 64)) == ImportedKey("i", group(0), 671, b"k" * 64)
    for key, period in ((b"", 671), (b"k" * 65, 671), (b"k", -1)):
        assert go_import.key_of(("i", topic, period, key)) == go_import.UNUSABLE_KEY
    assert go_import.key_of(("i", b"\x09", 671, b"k")) == go_import.OF_A_SKIPPED_SUBSCRIPTION


def test_the_source_url_is_checked_without_repeating_it() -> None:
    assert go_import.source_url("postgres://u:p@h:5/db") == "postgresql+asyncpg://u:p@h:5/db"
    assert go_import.source_url("postgresql+asyncpg://h/db") == "postgresql+asyncpg://h/db"
    for bad in ("postgresql://u:secret@h:port/db", "http://u:secret@h/db", "postgresql://u:secret@h/"):
        with pytest.raises(go_import.UnusableSourceUrl) as refused:
            go_import.source_url(bad)
        assert "secret" not in str(refused.value)


def test_the_report_is_counts_in_words() -> None:
    report = ImportReport(installations=Tally(imported=2), keys=Tally(imported=0))
    report.installations.of_which.update({"deleted": 1, "without a delivery mechanism": 0})
    report.subscriptions.skipped.update({"already here": 3})
    text_ = format_report(report, binary_topics=False, dry_run=False, ttl_seconds=60)
    assert text_.splitlines() == [
        "the Go server's database: topics stored as strings (before 2026)",
        "installations: 2 imported (1 deleted)",
        "subscriptions: 0 imported; skipped: 3 already here",
        "HMAC keys: 0 imported",
        "imported installations expire in 60 s (XMTP_PUSH_LEGACY_INSTALLATION_TTL_SECONDS) unless their app "
        "registers again",
    ]


@pytest.mark.slow
async def test_a_large_database_is_read_and_committed_in_batches(fresh_postgres: str) -> None:
    """More rows than a batch: every one is imported, and a second run finds every one here."""
    many = 2 * go_import.BATCH_ROWS + 500
    async with go_server_database(BINARY_TOPICS) as source:
        connection = await asyncpg.connect(source)
        try:
            await connection.execute(MANY_ROWS, many)
        finally:
            await connection.close()
        settings = make_settings(fresh_postgres)
        first, _ = await import_go_database(settings, source, dry_run=False)
        again, _ = await import_go_database(settings, source, dry_run=False)
    assert (first.installations.imported, first.subscriptions.imported, first.keys.imported) == (
        5 + many,
        11 + many,
        6 + many,
    )
    assert first.installations.of_which["without a delivery mechanism"] == 2
    assert again.installations.skipped["already here"] == 5 + many and again.keys.imported == 0
    rows = await stored(fresh_postgres)
    assert [len(rows[name]) for name in ("installations", "subscriptions", "keys")] == [
        5 + many,
        11 + many,
        6 + many,
    ]


# `many` installations with a mechanism each, a subscription to a group of their own and its key.
MANY_ROWS = """
WITH n AS (SELECT generate_series(1, $1) AS n),
i AS (INSERT INTO installations (id) SELECT 'many-' || n FROM n RETURNING id),
m AS (INSERT INTO device_delivery_mechanisms (installation_id, kind, token) SELECT id, 'apns', 'tok-' || id FROM i),
s AS (
    INSERT INTO subscriptions (installation_id, topic, is_active)
    SELECT 'many-' || n, '\\x00'::bytea || decode(lpad(to_hex(n), 32, '0'), 'hex'), TRUE FROM n
    RETURNING id
)
INSERT INTO subscription_hmac_keys (subscription_id, thirty_day_periods_since_epoch, key) SELECT id, 671, '\\x01'::bytea FROM s
"""


@pytest.mark.slow
@pytest.mark.postgres
async def test_no_installation_is_given_more_active_topics_than_the_api_allows(fresh_postgres: str) -> None:
    """With XMTP_PUSH_MAX_PUSH_TOPICS at 1: an installation's first active subscription read is
    imported, counting one it held already; the rest of its active ones and their keys are left out
    (a dry run counting the same), its inactive ones imported."""
    engine = create_engine(make_settings(fresh_postgres))
    try:
        async with create_session_factory(engine)() as session:  # bare-1 holds one already
            await repo.add_subscriptions(session, [ImportedSubscription("bare-1", group(9), True, False)], 43)
            await session.commit()
    finally:
        await engine.dispose()
    settings = make_settings(fresh_postgres, max_push_topics=1)
    async with go_server_database(BINARY_TOPICS) as source:
        dry, _ = await import_go_database(settings, source, dry_run=True)
        first, _ = await import_go_database(settings, source, dry_run=False)
        again, _ = await import_go_database(settings, source, dry_run=False)
    # Left out: one of ios-1's two active, one of android-1's, one of deleted-1's, bare-1's only.
    assert first.subscriptions.skipped[OVER_TOPIC_LIMIT] == 4 and first.subscriptions.imported == 11 - 4
    assert (dry.subscriptions, dry.keys) == (first.subscriptions, first.keys)
    assert again.subscriptions.skipped[OVER_TOPIC_LIMIT] == 4 and again.subscriptions.imported == 0
    rows = await stored(fresh_postgres)
    active = Counter(row[0] for row in rows["subscriptions"] if row[2])
    assert set(active.values()) == {1}, active
    assert ("android-1", group(4)) in {row[:2] for row in rows["subscriptions"]}  # inactive: imported
    subscribed = {row[:2] for row in rows["subscriptions"]}
    assert all(row[:2] in subscribed for row in rows["keys"]), rows["keys"]
    assert first.keys.imported + first.keys.skipped[OF_A_SUBSCRIPTION_OVER_THE_LIMIT] == 6
