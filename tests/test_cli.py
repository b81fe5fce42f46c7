"""The `xmtp-push` console script, run as a real subprocess (docs/configuration.md#commands)."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from tests.support.cli import START_TIMEOUT, dev_env, run, sqlite_url, started, stop, wait_healthy
from tests.support.ops import free_port
from tests.support.process import clean_env

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow


def tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


def register_webhook(grpc_port: int, recipient_id: bytes) -> pb.RecipientState:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT)
        stub = notification_pb2_grpc.NotificationServiceStub(channel)
        request = pb.RegisterRequest(
            recipient_id=recipient_id,
            recipient_secret=b"\x02" * 32,
            http=pb.HttpDelivery(url="http://127.0.0.1:9/hook", signing_key=b"k" * 32),
        )
        return stub.Register(request, timeout=30)


# --- help and start-up errors --------------------------------------------------------------------


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = run(["--help"], clean_env(), tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("dev", "api", "migrate"):
        assert name in result.stdout


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run([], clean_env(), tmp_path)
    assert result.returncode != 0
    assert "usage" in result.stderr.lower()


def test_unknown_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run(["no-such-command"], clean_env(), tmp_path)
    assert result.returncode != 0
    assert "usage" in result.stderr.lower()


@pytest.mark.parametrize("name", ["dev", "api", "migrate"])
def test_bad_setting_stops_start_up_naming_it(tmp_path: Path, name: str) -> None:
    db = tmp_path / "bad.db"
    env = clean_env(XMTP_PUSH_MAX_ATTEMPTS="0", XMTP_PUSH_DATABASE_URL=sqlite_url(db))
    result = run([name], env, tmp_path)
    assert result.returncode != 0
    assert "XMTP_PUSH_MAX_ATTEMPTS" in result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()  # nothing was started or migrated


def test_bad_secret_like_value_is_not_echoed(tmp_path: Path) -> None:
    secret = "sk_live_NOT_TO_BE_PRINTED_42"
    env = clean_env(XMTP_PUSH_HTTP_PORT=secret, XMTP_PUSH_DATABASE_URL=sqlite_url(tmp_path / "x.db"))
    result = run(["dev"], env, tmp_path)
    assert result.returncode != 0
    assert "XMTP_PUSH_HTTP_PORT" in result.stderr
    assert secret not in result.stderr and secret not in result.stdout


def test_missing_config_file_stops_start_up(tmp_path: Path) -> None:
    env = clean_env(XMTP_PUSH_CONFIG=str(tmp_path / "missing.toml"))
    result = run(["migrate"], env, tmp_path)
    assert result.returncode != 0
    assert "XMTP_PUSH_CONFIG" in result.stderr
    assert "Traceback" not in result.stderr


# --- migrate -------------------------------------------------------------------------------------


def test_migrate_creates_the_tables(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()  # the alembic folder is found without running from the repository
    result = run(["migrate"], clean_env(XMTP_PUSH_DATABASE_URL=sqlite_url(db)), elsewhere)
    assert result.returncode == 0, result.stderr
    assert {"recipients", "subscriptions", "alembic_version"} <= tables(db)
    with sqlite3.connect(db) as connection:
        versions = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    assert len(versions) == 1

    again = run(["migrate"], clean_env(XMTP_PUSH_DATABASE_URL=sqlite_url(db)), elsewhere)
    assert again.returncode == 0, again.stderr
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == versions


def test_migrate_reads_the_config_file(tmp_path: Path) -> None:
    db = tmp_path / "from-file.db"
    config = tmp_path / "xmtp-push.toml"
    config.write_text(f'database_url = "{sqlite_url(db)}"\n')
    result = run(["migrate"], clean_env(XMTP_PUSH_CONFIG=str(config)), tmp_path)
    assert result.returncode == 0, result.stderr
    assert {"recipients", "subscriptions"} <= tables(db)


# --- dev -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_dev_serves_then_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    http_port, grpc_port = free_port(), free_port()
    recipient_id = bytes([sig.value]) * 32
    with started(["dev"], dev_env(tmp_path, http_port, grpc_port), tmp_path) as process:
        wait_healthy(process, http_port)
        assert {"recipients", "subscriptions"} <= tables(tmp_path / "dev.db")  # migrated first

        state = register_webhook(grpc_port, recipient_id)
        assert state.channel == pb.CHANNEL_HTTP
        assert state.topic_count == 0
        assert state.expires_at_ns > time.time_ns()

        code, _, err = stop(process, sig)
        assert code == 0, err
        assert "Traceback" not in err

    with sqlite3.connect(tmp_path / "dev.db") as connection:
        rows = connection.execute("SELECT COUNT(*) FROM recipients WHERE id = ?", (recipient_id,)).fetchone()
    assert rows == (1,)


def test_dev_refuses_a_webhook_channel_that_is_not_enabled(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    env = dev_env(tmp_path, http_port, grpc_port, XMTP_PUSH_WEBHOOK_ENABLED="false")
    with started(["dev"], env, tmp_path) as process:
        wait_healthy(process, http_port)
        with pytest.raises(grpc.RpcError) as raised:
            register_webhook(grpc_port, b"\x07" * 32)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        code, _, err = stop(process, signal.SIGTERM)
        assert code == 0, err


def test_dev_with_an_occupied_port_fails(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        env = dev_env(tmp_path, taken, free_port())
        with started(["dev"], env, tmp_path) as process:
            try:
                process.wait(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail("xmtp-push kept running although its HTTP port was taken")
            assert process.returncode != 0


def test_dev_on_a_taken_grpc_port_exits_with_one_line(tmp_path: Path) -> None:
    # Another server holds the port (without SO_REUSEPORT): start-up must stop, not share the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = clean_env(
            XMTP_PUSH_DATABASE_URL=sqlite_url(tmp_path / "db.sqlite"),
            XMTP_PUSH_GRPC_PORT=str(port),
            XMTP_PUSH_HTTP_PORT=str(free_port()),
        )
        result = run(["dev"], env, tmp_path)
    assert result.returncode == 3
    assert f"xmtp-push: gRPC address 127.0.0.1:{port} is in use or cannot be bound" in result.stderr
    assert "Traceback" not in result.stderr
