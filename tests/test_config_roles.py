"""`xmtp-push config check --role ROLE` checks what that command needs and nothing else: the Matrix
gateway and the Marmot server need no database, and their check creates no SQLite file; without
`--role` it checks the roles whose settings are present (docs/operations.md, "Operator commands")."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from fakes import keys
from tests.support.cli import run
from tests.support.ops import child_env

# Each test runs the console script several times: seconds.
pytestmark = pytest.mark.slow

DEFAULT_SQLITE_FILE = "xmtp-push.db"  # where the default XMTP_PUSH_DATABASE_URL points


def check(cwd: Path, *role: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return run(["config", "check", *(("--role", *role) if role else ())], child_env(**settings), cwd)


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """`ok  <name> <detail>` and `FAIL <name> <detail>` lines as name -> the whole line."""
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith(("ok   ", "FAIL ")):
            found[line[5:20].strip()] = line
    return found


def gateway_apps(folder: Path) -> str:
    account = folder / "service-account.json"
    account.write_text(keys.service_account(project_id="matrix-project"))
    app = {
        "type": "gcm",
        "api_version": "v1",
        "project_id": "matrix-project",
        "service_account_file": str(account),
    }
    path = folder / "sygnal.yaml"
    path.write_text(yaml.safe_dump({"apps": {"org.example.matrix": app}}))
    return str(path)


def test_a_gateway_needs_no_database_and_its_check_creates_no_file(tmp_path: Path) -> None:
    apps = gateway_apps(tmp_path)
    for result in (check(tmp_path, "gateway", matrix_apps=apps), check(tmp_path, matrix_apps=apps)):
        assert result.returncode == 0, result
        assert set(lines(result)) == {"matrix apps"}, result.stdout
        assert result.stdout.splitlines()[0] == "checking for: gateway"
    assert not (tmp_path / DEFAULT_SQLITE_FILE).exists()

    unset = check(tmp_path, "gateway")
    assert unset.returncode == 2, unset
    assert "FAIL gateway        XMTP_PUSH_MATRIX_APPS: required by `gateway`" in unset.stdout
    assert not (tmp_path / DEFAULT_SQLITE_FILE).exists()


def test_a_marmot_server_needs_no_database_and_its_check_creates_no_file(tmp_path: Path) -> None:
    marmot = {
        "marmot_secret_key": secrets.token_bytes(32).hex(),
        "marmot_relays": "wss://relay.example",
        "fcm_service_account": keys.service_account(),
    }
    for result in (check(tmp_path, "marmot", **marmot), check(tmp_path, **marmot)):
        assert result.returncode == 0, result
        assert set(lines(result)) == {"channel apns", "channel fcm", "marmot"}, result.stdout
        assert "pushes through fcm" in lines(result)["marmot"]
    assert not (tmp_path / DEFAULT_SQLITE_FILE).exists()


def test_a_role_fails_on_what_its_command_cannot_start_without(tmp_path: Path) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    worker = check(tmp_path, "worker", database_url=database, webhook_enabled="true")
    assert worker.returncode == 2, worker
    assert lines(worker)["worker"] == "FAIL worker         XMTP_PUSH_REDIS_URL: required by `worker`"
    listen = check(tmp_path, "listen", database_url=database, webhook_enabled="true")
    assert listen.returncode == 2, listen
    assert (
        "FAIL listen         XMTP_PUSH_XMTPD_ADDRESS or XMTP_PUSH_NODE_GO_ADDRESS: one of them is required"
        " by `listen`" in listen.stdout
    )
    assert not [name for name in lines(listen) if name.startswith("channel")], (
        listen.stdout
    )  # it sends nothing
    # An XMTP role checks the database (here: not migrated) and the channels; not the gateway's apps.
    api = check(
        tmp_path, "api", database_url=database, webhook_enabled="true", matrix_apps="/nonexistent.yaml"
    )
    assert set(lines(api)) >= {"channel apns", "channel http", "database", "matrix apps"}
    assert check(tmp_path, "worker", database_url=database).stdout.count("matrix") == 0
