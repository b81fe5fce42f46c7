"""A channel half set (some of the settings that configure its default app, not all) is a mistake,
not "not configured": `config check` fails on it and the commands that send refuse to start (exit 2),
naming the settings missing, never a value. Which settings those are comes from the channel's
descriptor (`CHANNELS`), for every channel with a default app."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.config import ENV_PREFIX, Settings, SettingsError
from app.delivery.registry import FLAT_CHANNELS, refuse_half_set_channels
from fakes import keys
from tests.support import create_sqlite_database
from tests.support.cli import run
from tests.support.ops import child_env

APNS_KEY = keys.apns_key_pem()
MISSING = ("XMTP_PUSH_APNS_KEY_ID", "XMTP_PUSH_APNS_TEAM_ID", "XMTP_PUSH_APNS_BUNDLE_ID")


def env_name(setting: str) -> str:
    return f"{ENV_PREFIX}{setting.upper()}"


@pytest.mark.parametrize("channel", [c for c, d in FLAT_CHANNELS.items() if len(d.required) > 1])
def test_each_channel_set_in_part_is_refused_naming_what_is_missing(channel: str) -> None:
    default = FLAT_CHANNELS[channel]  # type: ignore[index]
    first, *rest = default.required
    settings = Settings.model_construct(**{first: "set"})
    assert default.missing(settings) == tuple(rest)
    with pytest.raises(SettingsError) as refused:
        refuse_half_set_channels(settings)
    assert str(refused.value).startswith(", ".join(env_name(name) for name in rest) + ": not set")
    assert default.missing(Settings.model_construct()) == ()


@pytest.mark.slow
def test_config_check_fails_and_start_up_is_refused_on_a_half_set_channel(tmp_path: Path) -> None:
    database = asyncio.run(create_sqlite_database(tmp_path))
    half = child_env(
        database_url=database, webhook_enabled="true", apns_key=APNS_KEY, apns_key_id="KEYID12345"
    )
    checked = run(["config", "check"], half, tmp_path)
    assert checked.returncode == 2, checked
    (line,) = [line for line in checked.stdout.splitlines() if line.startswith("FAIL")]
    assert line.startswith("FAIL channel apns   XMTP_PUSH_APNS_TEAM_ID, XMTP_PUSH_APNS_BUNDLE_ID: not set")
    for command in (["api"], ["dev"], ["send-test", "00" * 32]):
        refused = run(command, half, tmp_path)
        assert refused.returncode == 2, refused
        assert "XMTP_PUSH_APNS_TEAM_ID, XMTP_PUSH_APNS_BUNDLE_ID: not set" in refused.stderr, refused
        assert "BEGIN" not in refused.stdout + refused.stderr and "KEYID12345" not in refused.stderr

    only_key = child_env(database_url=database, webhook_enabled="true", apns_key=APNS_KEY)
    checked = run(["config", "check"], only_key, tmp_path)
    assert checked.returncode == 2, checked
    assert ", ".join(MISSING) + ": not set, while XMTP_PUSH_APNS_KEY is" in checked.stdout
