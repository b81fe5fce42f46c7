"""`xmtp-push marmot` as a real subprocess: `--show-pubkey`, and start-up refusals."""

from __future__ import annotations

import contextlib
import re
import secrets
import signal
from pathlib import Path

import httpx
import nostr_sdk as nostr
import pytest

from app.marmot import secp
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, encrypt_token
from fakes import keys as app_keys
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support import eventually
from tests.support.cli import dev_env, run, started, stop, wait_healthy
from tests.support.marmot import (  # noqa: F401  (fixtures)
    Relay,
    b64,
    fakes,
    gift_wrap,
    marmot_env,
    running_relay,
)
from tests.support.ops import free_port
from tests.support.process import child, clean_env

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

KEY = "XMTP_PUSH_MARMOT_SECRET_KEY"


def expected_lines(secret_hex: str) -> list[str]:
    """What nostr-sdk says the key's public forms are."""
    keys = nostr.Keys.parse(secret_hex)
    return [keys.public_key().to_hex(), keys.public_key().to_bech32()]


@pytest.mark.parametrize("form", ["hex", "nsec", "file"])
def test_show_pubkey_prints_hex_and_npub_and_needs_only_the_key(form: str, tmp_path: Path) -> None:
    secret = secrets.token_bytes(32).hex()
    value = {
        "hex": secret,
        "nsec": nostr.Keys.parse(secret).secret_key().to_bech32(),
        "file": str(tmp_path / "marmot.key"),
    }[form]
    (tmp_path / "marmot.key").write_text(secret + "\n")
    result = run(["marmot", "--show-pubkey"], clean_env(**{KEY: value}), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected_lines(secret)
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 2
    assert secret not in result.stderr


def test_without_the_key_marmot_refuses_naming_the_setting(tmp_path: Path) -> None:
    result = run(["marmot", "--show-pubkey"], clean_env(), tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert KEY in result.stderr


@pytest.mark.parametrize("value", ["zz" * 32, "nsec1qqqqqq", "00" * 32, "ff" * 32])
def test_a_bad_key_is_refused_without_echoing_it(value: str, tmp_path: Path) -> None:
    result = run(["marmot", "--show-pubkey"], clean_env(**{KEY: value}), tmp_path)
    assert result.returncode == 2
    assert KEY in result.stderr
    assert value not in result.stderr and value not in result.stdout


def test_the_key_is_hidden_from_the_settings_repr() -> None:
    from app.core.config import Settings

    secret = secrets.token_bytes(32).hex()
    settings = Settings(marmot_secret_key=secret)
    assert secret not in repr(settings) and secret not in str(settings)
    assert settings.marmot_secret_key is not None
    assert settings.marmot_secret_key.get_secret_value() == secret


def test_marmot_defaults_are_the_spec_tiers() -> None:
    from app.core.config import MARMOT_RELAY_WATCHDOG_SECONDS, Settings

    settings = Settings()
    assert (settings.marmot_global_per_minute, settings.marmot_global_per_hour) == (600, 30_000)
    assert (settings.marmot_chunk_per_minute, settings.marmot_chunk_per_hour) == (240, 5_000)
    assert (settings.marmot_device_per_minute, settings.marmot_device_per_hour) == (240, 5_000)
    assert settings.marmot_max_concurrent == 64
    assert settings.marmot_pending_bytes == 64 * 1024 * 1024 == 67_108_864
    assert settings.marmot_pushes_in_flight == 32
    assert settings.marmot_dedup_seconds == 300
    assert settings.marmot_relay_watchdog_seconds == MARMOT_RELAY_WATCHDOG_SECONDS == 60
    assert settings.marmot_relays == ()
    assert not settings.marmot_configured
    relays = Settings(marmot_relays=" wss://a.example , ws://127.0.0.1:7000,wss://a.example")
    assert relays.marmot_relays == ("wss://a.example", "ws://127.0.0.1:7000")


# --------------------------------------------------------------------------- serving


async def ready(http_port: int, timeout: float = 20.0) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as http:

        async def answers() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await eventually(answers, timeout, "/readyz 200")


async def trigger(relay: Relay, key: ServerKey, token: str) -> None:
    await relay.publish(gift_wrap(key.public_hex, b64(encrypt_token(key.public_x, Platform.APNS, token))))


async def delivered_once_subscribed(relay: Relay, key: ServerKey, apns: FakeApns) -> None:
    """Triggers sent before the server subscribes are never seen (the filter asks for none stored):
    send one after another until one arrives."""
    for attempt in range(60):
        await trigger(relay, key, f"{attempt:02x}" * 32)
        with contextlib.suppress(AssertionError):
            await apns.wait_for(1, timeout=0.5)
            return
    raise AssertionError("no trigger reached APNs")


async def test_marmot_serves_readiness_metrics_and_triggers_then_stops_cleanly(
    tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    key, http_port = ServerKey(secp.fresh_secret()), free_port()
    async with running_relay() as relay:
        env = clean_env(**marmot_env(key, relay.url, http_port, apns, fcm))
        with started(["marmot"], env, tmp_path) as process:
            wait_healthy(process, http_port)
            await ready(http_port)
            await trigger(relay, key, "ab" * 32)
            (request,) = await apns.wait_for(1)
            assert request.token == "ab" * 32
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as http:
                text = (await http.get("/metrics")).text
            assert 'xmtp_push_marmot_triggers_total{result="accepted"} 1.0' in text
            assert 'xmtp_push_marmot_tokens_total{outcome="delivered",platform="apns"} 1.0' in text
            assert "xmtp_push_marmot_relays_connected 1.0" in text
            code, out, err = stop(process, signal.SIGTERM)
    assert code == 0, err
    assert "ab" * 32 not in out + err and key.secret.hex() not in out + err and relay.url not in out + err


async def test_readyz_is_503_while_no_relay_is_subscribed(
    tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    key, http_port = ServerKey(secp.fresh_secret()), free_port()
    nowhere = f"ws://127.0.0.1:{free_port()}"
    with started(
        ["marmot"], clean_env(**marmot_env(key, nowhere, http_port, apns, fcm)), tmp_path
    ) as process:
        wait_healthy(process, http_port)
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{http_port}/readyz", timeout=5)
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable", "checks": {"relays": "unavailable", "push": "ok"}}
        code, _, err = stop(process, signal.SIGINT)
    assert code == 0, err


def test_marmot_refuses_to_start_without_relays_or_a_push_channel(tmp_path: Path) -> None:
    key = secp.fresh_secret().hex()
    no_relays = run(["marmot"], clean_env(**{KEY: key}), tmp_path)
    assert no_relays.returncode == 2 and "XMTP_PUSH_MARMOT_RELAYS" in no_relays.stderr
    no_channel = run(
        ["marmot"], clean_env(**{KEY: key, "XMTP_PUSH_MARMOT_RELAYS": "ws://127.0.0.1:9"}), tmp_path
    )
    assert no_channel.returncode == 2 and "APNs or FCM" in no_channel.stderr


def test_dev_with_a_marmot_key_needs_relays(tmp_path: Path) -> None:
    env = dev_env(tmp_path, free_port(), free_port(), **{KEY: secp.fresh_secret().hex()})
    result = run(["dev"], env, tmp_path)
    assert result.returncode == 2 and "XMTP_PUSH_MARMOT_RELAYS" in result.stderr


async def test_dev_runs_the_marmot_server_when_its_key_is_set(
    tmp_path: Path, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    key, http_port, grpc_port = ServerKey(secp.fresh_secret()), free_port(), free_port()
    async with running_relay() as relay:
        marmot = marmot_env(key, relay.url, http_port, apns, fcm)
        with started(["dev"], dev_env(tmp_path, http_port, grpc_port, **marmot), tmp_path) as process:
            wait_healthy(process, http_port)
            await delivered_once_subscribed(relay, key, apns)
            code, _, err = stop(process, signal.SIGTERM)
    assert code == 0, err


# --------------------------------------------------------------------------- config check


def test_config_check_reports_the_marmot_settings(tmp_path: Path) -> None:
    """One `marmot` line: the key set or not (never its value), the relays' count, the channels its
    pushes can use; a key `xmtp-push marmot` would refuse, or one it could not serve, fails."""
    from app.core.config import Settings
    from app.ops.checks import Check, marmot_check
    from app.ops.failures import INVALID_CONFIGURATION

    secret = secrets.token_bytes(32).hex()
    relays = "wss://relay.example,ws://127.0.0.1:7000"
    apns = {
        "apns_key": app_keys.apns_key_pem(),
        "apns_key_id": "KEYID12345",
        "apns_team_id": "TEAMID1234",
        "apns_bundle_id": "org.example.app",
    }
    fcm = {"fcm_service_account": app_keys.service_account()}

    def check(**values: str) -> Check:
        # The loopback relay allowed unencrypted, as `xmtp-push marmot` would need it.
        return marmot_check(Settings(marmot_allow_unencrypted_relays=True, **values))  # type: ignore[arg-type]

    assert check() == Check(
        "marmot", True, "not configured (XMTP_PUSH_MARMOT_SECRET_KEY not set), 0 relay(s)"
    )
    assert check(marmot_secret_key=secret, marmot_relays=relays, **apns, **fcm) == Check(
        "marmot", True, "key set, 2 relay(s), pushes through apns, fcm"
    )
    key_file = tmp_path / "marmot.key"
    key_file.write_text(ServerKey(bytes.fromhex(secret)).secret.hex() + "\n")
    key_file.chmod(0o600)  # a key file others may read is refused (tests/test_marmot_startup.py)
    assert check(marmot_secret_key=str(key_file), marmot_relays=relays, **fcm) == Check(
        "marmot", True, "key set, 2 relay(s), pushes through fcm"
    )
    no_relays = check(marmot_secret_key=secret, **apns)
    assert no_relays == Check(
        "marmot",
        False,
        "key set, 0 relay(s), pushes through apns: XMTP_PUSH_MARMOT_RELAYS is required",
        INVALID_CONFIGURATION,
    )
    no_channel = check(marmot_secret_key=secret, marmot_relays=relays)
    assert no_channel == Check(
        "marmot",
        False,
        "key set, 2 relay(s), pushes through no channel: configure APNs or FCM",
        INVALID_CONFIGURATION,
    )
    order = "ff" * 32  # not below the curve's order
    bad = check(marmot_secret_key=order, marmot_relays=relays, **apns)
    assert (bad.ok, bad.exit_code) == (False, INVALID_CONFIGURATION)
    assert bad.detail.startswith("XMTP_PUSH_MARMOT_SECRET_KEY: ") and order not in bad.detail
    for result in (no_relays, no_channel):
        assert secret not in result.detail


# --------------------------------------------------------------------------- relays in the log


async def test_relays_are_logged_by_host_never_by_number_path_query_or_credentials(
    fakes: tuple[FakeApns, FakeFcm],
) -> None:
    apns, fcm = fakes
    key, http_port, dead_port = ServerKey(secp.fresh_secret()), free_port(), free_port()
    dead = f"ws://operator:hunter2@127.0.0.1:{dead_port}/inbox/private-path?token=abc123"
    async with running_relay() as relay:
        env = clean_env(**marmot_env(key, f"{relay.url},{dead}", http_port, apns, fcm))
        async with child("marmot", ["marmot"], env) as process:
            await process.line(re.compile(rf"relay 127\.0\.0\.1:{relay.port}: subscribed"))
            await process.line(re.compile(rf"relay 127\.0\.0\.1:{dead_port}: connection lost or refused \("))
            assert await process.stop() == 0, process.output()
    logged = "\n".join(process.lines)
    assert not re.search(r"relay [0-9]+:", logged), logged
    for part in ("operator", "hunter2", "private-path", "token=abc123", "/inbox"):
        assert part not in logged
