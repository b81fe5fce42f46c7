"""Expected operational failures end a command with one line naming the setting and a code of its own
(docs/configuration.md, "Exit codes"); the traceback only with `--debug` or XMTP_PUSH_LOG_LEVEL=DEBUG.
The password in a URL is never printed."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import asyncpg
import pytest

from app.ops import failures
from tests.support import POSTGRES_ADMIN_DSN, create_sqlite_database
from tests.support.ops import child_env, command, free_port

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

PASSWORD = "pw-" + secrets.token_hex(6)
RUN_TIMEOUT = 60.0
SERVER = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].split("://", 1)[1].split("@")[-1]  # host:port


def postgres(database: str, user: str = "postgres") -> str:
    return f"postgresql+asyncpg://{user}:{PASSWORD}@{SERVER}/{database}"


def xmtp_push(*args: str, cwd: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args],
        env=child_env(**settings),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def empty_postgres() -> Iterator[str]:
    """A PostgreSQL database that exists and was never migrated."""
    name = f"xmtp_push_test_{secrets.token_hex(4)}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres(name)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


DATABASE_CASES = {
    "missing": (
        lambda _: postgres("xmtp_push_no_such_database"),
        failures.DATABASE_MISSING,
        "does not exist",
    ),
    "refused": (
        lambda _: f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:{free_port()}/x",
        failures.DATABASE_UNREACHABLE,
        "refused",
    ),
    "credentials": (
        lambda _: postgres("postgres", user="xmtp_push_no_such_role"),
        failures.DATABASE_CREDENTIALS_REFUSED,
        "user or its password",
    ),
    "sqlite folder": (
        lambda tmp: f"sqlite+aiosqlite:///{tmp / 'no' / 'x.db'}",
        failures.DATABASE_MISSING,
        "cannot be opened",
    ),
    "malformed": (
        lambda _: f"postgresql+asyncpg://u:{PASSWORD}@host:port/db",
        failures.INVALID_CONFIGURATION,
        "not a well-formed URL",
    ),
}


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, setting: str, words: str) -> None:
    shown = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == code, shown
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("xmtp-push: "), shown
    assert setting in result.stderr and words in result.stderr, shown
    assert "Traceback" not in result.stderr and PASSWORD not in result.stdout + result.stderr, shown


# The cases whose command reaches PostgreSQL itself (the others fail before connecting, or on SQLite).
REACHES_POSTGRES = {"missing", "credentials"}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=pytest.mark.postgres) if case in REACHES_POSTGRES else case
        for case in DATABASE_CASES
    ],
)
@pytest.mark.parametrize("args", [("migrate",), ("stats",), ("dev",)], ids=" ".join)
def test_a_database_failure_is_one_line_with_its_code(tmp_path: Path, case: str, args: tuple[str]) -> None:
    url, code, words = DATABASE_CASES[case]
    result = xmtp_push(*args, cwd=tmp_path, database_url=url(tmp_path))
    assert_one_line(result, code, "XMTP_PUSH_DATABASE_URL", words)


def test_the_codes_are_distinct() -> None:
    names = [name for name in dir(failures) if name.isupper() and isinstance(getattr(failures, name), int)]
    codes = [getattr(failures, name) for name in names]
    assert len(set(codes)) == len(codes) >= 9, dict(zip(names, codes, strict=True))


def test_an_unmigrated_database_says_to_migrate(tmp_path: Path, empty_postgres: str) -> None:
    for url in (empty_postgres, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"):
        result = xmtp_push("stats", cwd=tmp_path, database_url=url)
        assert_one_line(result, failures.DATABASE_NOT_MIGRATED, "XMTP_PUSH_DATABASE_URL", "xmtp-push migrate")


def test_an_unreachable_redis_is_one_line_with_its_code(tmp_path: Path) -> None:
    database = asyncio.run(create_sqlite_database(tmp_path))
    redis = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    result = xmtp_push("stats", cwd=tmp_path, database_url=database, redis_url=redis)
    assert_one_line(result, failures.REDIS_UNREACHABLE, "XMTP_PUSH_REDIS_URL", "unreachable")


@pytest.mark.postgres
def test_config_check_exits_with_the_first_failures_code(tmp_path: Path) -> None:
    result = xmtp_push("config", "check", cwd=tmp_path, database_url=postgres("xmtp_push_no_such_database"))
    assert result.returncode == failures.DATABASE_MISSING, result
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert line.startswith("FAIL database") and "XMTP_PUSH_DATABASE_URL: the database does not exist" in line
    assert "Traceback" not in result.stderr and PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("how", ["--debug", "LOG_LEVEL=DEBUG"])
@pytest.mark.postgres
def test_debugging_shows_the_traceback_too(tmp_path: Path, how: str) -> None:
    url = postgres("xmtp_push_no_such_database")
    if how == "--debug":
        result = xmtp_push("--debug", "migrate", cwd=tmp_path, database_url=url)
    else:
        result = xmtp_push("migrate", cwd=tmp_path, database_url=url, log_level="DEBUG")
    assert result.returncode == failures.DATABASE_MISSING, result
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("xmtp-push: XMTP_PUSH_DATABASE_URL: "), result.stderr


def test_migrate_still_works(tmp_path: Path) -> None:
    db = tmp_path / "fine.db"
    result = xmtp_push("migrate", cwd=tmp_path, database_url=f"sqlite+aiosqlite:///{db}")
    assert result.returncode == 0, result
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT COUNT(*) FROM alembic_version").fetchone() == (1,)


# --- the first run: version, names that are no setting, a configuration with no channel ----------


def test_version_is_the_installed_packages(tmp_path: Path) -> None:
    result = xmtp_push("--version", cwd=tmp_path)
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"xmtp-push {metadata.version('xmtp-push')}"


def test_a_mistyped_variable_is_named_with_the_nearest_setting(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    result = xmtp_push("migrate", cwd=tmp_path, database_url=db, webhook_enabld="true")
    assert result.returncode == 0, result
    assert (
        "xmtp-push: warning: XMTP_PUSH_WEBHOOK_ENABLD is not a setting and is ignored "
        "(did you mean XMTP_PUSH_WEBHOOK_ENABLED?)"
    ) in result.stderr.splitlines()


def test_config_check_warns_when_no_channel_is_configured(tmp_path: Path) -> None:
    database = asyncio.run(create_sqlite_database(tmp_path))
    bare = xmtp_push("config", "check", cwd=tmp_path, database_url=database)
    assert bare.returncode == 0, bare
    (warning,) = [line for line in bare.stdout.splitlines() if line.startswith("warn")]
    assert warning.startswith("warn channels       none configured")
    for setting in ("XMTP_PUSH_APNS_KEY", "XMTP_PUSH_FCM_SERVICE_ACCOUNT", "XMTP_PUSH_WEBHOOK_ENABLED=true"):
        assert setting in warning
    assert bare.stdout.splitlines()[-1] == "configuration is usable (1 warning(s))"

    webhooks = xmtp_push("config", "check", cwd=tmp_path, database_url=database, webhook_enabled="true")
    assert webhooks.returncode == 0, webhooks
    assert "warn" not in webhooks.stdout and webhooks.stdout.splitlines()[-1] == "configuration is usable"
