"""What `xmtp-push marmot` refuses at start, as a real subprocess: a key file its group or others may
read (docs/marmot.md, step 1), and ws:// relays unless XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS is set."""

from __future__ import annotations

import signal
from pathlib import Path

import nostr_sdk as nostr
import pytest

from app.marmot import secp
from app.marmot.keys import ServerKey
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support.cli import dev_env, run, started, stop, wait_healthy
from tests.support.marmot import fakes, marmot_env  # noqa: F401  (fixtures)
from tests.support.ops import free_port
from tests.support.process import clean_env

# Each test here runs the product end to end: a second or more.
pytestmark = pytest.mark.slow

KEY = "XMTP_PUSH_MARMOT_SECRET_KEY"
RELAYS = "XMTP_PUSH_MARMOT_RELAYS"
ALLOW = "XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS"


def key_file(folder: Path, mode: int) -> tuple[Path, str]:
    """A key file of `mode`, and the secret it holds."""
    secret = secp.fresh_secret().hex()
    path = folder / "marmot.key"
    path.write_text(secret + "\n")
    path.chmod(mode)
    return path, secret


def server_env(fakes: tuple[FakeApns, FakeFcm], key_setting: str, relay: str, **extra: str) -> dict[str, str]:
    """`xmtp-push marmot`'s settings with the key setting and relays given, the channels at the fakes."""
    apns, fcm = fakes
    env = marmot_env(ServerKey(secp.fresh_secret()), relay, free_port(), apns, fcm)
    return clean_env(**{**env, KEY: key_setting, **extra})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=oct)
def test_a_key_file_its_group_or_others_may_read_is_refused_naming_the_setting(
    mode: int, tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    path, secret = key_file(tmp_path, mode)
    result = run(["marmot"], server_env(fakes, str(path), f"ws://127.0.0.1:{free_port()}"), tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert f"{KEY}: the key file may be read by its group or by others (mode {mode:04o})" in result.stderr
    assert "chmod 600" in result.stderr
    assert secret not in result.stderr and str(path) not in result.stderr


def test_config_check_fails_on_what_marmot_refuses_at_start(
    tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    path, secret = key_file(tmp_path, 0o644)
    env = server_env(fakes, str(path), f"ws://127.0.0.1:{free_port()}")
    env.pop("XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS", None)
    result = run(["config", "check", "--role", "marmot"], env, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL") and "marmot" in line]
    assert len(failed) == 1, result.stdout
    assert "the key file may be read by its group or by others" in failed[0]
    assert "XMTP_PUSH_MARMOT_RELAYS" in failed[0]
    assert secret not in result.stdout + result.stderr and str(path) not in result.stdout


def test_dev_refuses_such_a_key_file_too(tmp_path: Path) -> None:
    path, _ = key_file(tmp_path, 0o644)
    relays = f"ws://127.0.0.1:{free_port()}"
    env = dev_env(tmp_path, free_port(), free_port(), **{KEY: str(path), "XMTP_PUSH_MARMOT_RELAYS": relays})
    result = run(["dev"], env, tmp_path)
    assert result.returncode == 2 and "the key file may be read by its group or by others" in result.stderr
    assert not (tmp_path / "dev.db").exists()  # refused before anything was made


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=oct)
def test_a_key_file_for_its_owner_alone_serves(
    mode: int, tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    path, secret = key_file(tmp_path, mode)
    env = server_env(fakes, str(path), f"ws://127.0.0.1:{free_port()}")
    http_port = int(env["XMTP_PUSH_HTTP_PORT"])
    with started(["marmot"], env, tmp_path) as process:
        wait_healthy(process, http_port)
        code, out, err = stop(process, signal.SIGTERM)
    assert code == 0, err
    assert secret not in out + err


def test_show_pubkey_prints_only_the_public_key_and_warns_of_a_readable_key_file(tmp_path: Path) -> None:
    """stdout holds the two public forms and nothing else, at DEBUG too; the warning goes to stderr."""
    path, secret = key_file(tmp_path, 0o644)
    env = clean_env(**{KEY: str(path), "XMTP_PUSH_LOG_LEVEL": "DEBUG"})
    result = run(["marmot", "--show-pubkey"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    public = nostr.Keys.parse(secret).public_key()
    assert result.stdout == f"{public.to_hex()}\n{public.to_bech32()}\n"
    assert "the key file may be read by its group or by others (mode 0644)" in result.stderr
    assert secret not in result.stdout + result.stderr
    path.chmod(0o600)
    quiet = run(["marmot", "--show-pubkey"], env, tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == result.stdout and "warning" not in quiet.stderr


# --------------------------------------------------------------------------- ws:// relays


def test_ws_relays_are_refused_unless_allowed_naming_the_settings(
    tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    relays = f"wss://relay.example.org,ws://operator:hunter2@127.0.0.1:{free_port()}/inbox?k=v"
    env = server_env(fakes, secp.fresh_secret().hex(), relays)
    del env[ALLOW]
    result = run(["marmot"], env, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert f"{RELAYS}: 1 of 2 relay(s) are ws://" in result.stderr and f"{ALLOW}=true" in result.stderr
    for part in ("hunter2", "operator", "/inbox", "k=v", "relay.example.org"):
        assert part not in result.stderr
    env[ALLOW] = "false"
    assert run(["marmot"], env, tmp_path).returncode == 2


def test_dev_refuses_ws_relays_too_unless_allowed(tmp_path: Path) -> None:
    settings = {KEY: secp.fresh_secret().hex(), RELAYS: f"ws://127.0.0.1:{free_port()}"}
    result = run(["dev"], dev_env(tmp_path, free_port(), free_port(), **settings), tmp_path)
    assert result.returncode == 2 and f"{RELAYS}: 1 of 1 relay(s) are ws://" in result.stderr


def test_wss_relays_need_no_allowance(tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]) -> None:
    env = server_env(fakes, secp.fresh_secret().hex(), f"wss://127.0.0.1:{free_port()}")
    del env[ALLOW]
    with started(["marmot"], env, tmp_path) as process:
        wait_healthy(process, int(env["XMTP_PUSH_HTTP_PORT"]))
        code, _, err = stop(process, signal.SIGTERM)
    assert code == 0, err
