"""Commands meant for a person (`config check`, `stats`, `send-test`, `marmot --show-pubkey`,
`migrate`) print their answer to stdout as text; log lines go to stderr, WARNING and above only,
whatever XMTP_PUSH_LOG_LEVEL says (`--debug` shows more)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from app.core.migrations import alembic_config
from tests.support.cli import run, sqlite_url
from tests.support.ops import child_env
from tests.support.process import json_lines

# Each runs the console script: a second or more.
pytestmark = pytest.mark.slow

QUIET_LEVELS = {"debug", "info"}


def log_events(text: str) -> list[dict[str, object]]:
    return json_lines(text.splitlines())


def assert_for_a_person(result: subprocess.CompletedProcess[str]) -> None:
    assert result.stdout.strip(), result
    assert not log_events(result.stdout), f"log lines in the answer:\n{result.stdout}"
    quiet = [e for e in log_events(result.stderr) if str(e.get("level")) in QUIET_LEVELS]
    assert not quiet, f"log lines below WARNING:\n{result.stderr}"


def test_each_command_for_a_person_answers_on_stdout_with_no_log_line_below_warning(tmp_path: Path) -> None:
    database = sqlite_url(tmp_path / "person.db")
    env = child_env(database_url=database, webhook_enabled="true", log_level="INFO")
    head = ScriptDirectory.from_config(alembic_config(database)).get_current_head()

    migrated = run(["migrate"], env, tmp_path)
    assert migrated.returncode == 0, migrated
    assert_for_a_person(migrated)
    assert migrated.stdout == f"database schema at {head}, the newest\n"
    again = run(["migrate"], env, tmp_path)
    assert again.stdout == migrated.stdout, again

    for args in (["config", "check"], ["stats"]):
        result = run(args, env, tmp_path)
        assert result.returncode == 0, result
        assert_for_a_person(result)
    unknown = run(["send-test", "ab" * 32], env, tmp_path)
    assert unknown.returncode == 1, unknown
    assert unknown.stderr.splitlines()[-1] == "recipient is not registered", unknown  # no log line after it
    assert not log_events(unknown.stdout + unknown.stderr), unknown

    marmot = child_env(log_level="INFO", marmot_secret_key=secrets.token_bytes(32).hex())
    pubkey = run(["marmot", "--show-pubkey"], marmot, tmp_path)
    assert pubkey.returncode == 0, pubkey
    assert_for_a_person(pubkey)
    assert len(pubkey.stdout.splitlines()) == 2
