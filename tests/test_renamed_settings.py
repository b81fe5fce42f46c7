"""Renamed settings: an old name is still read as its new one, told in one deprecation line that never
holds the value, and both names given different values are refused, naming both
(docs/configuration.md#configuration)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.core.config import ENV_PREFIX, Settings, SettingsError, load_settings, unknown_setting_warnings
from app.core.renamed_settings import RENAMED_SETTINGS
from tests.support import create_sqlite_database
from tests.support.ops import child_env, command
from tests.support.settings import clean_environment, write_config  # noqa: F401  (a fixture, autouse)

CONFIGURATION_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
# Each old name, a value given under it (none a default, none in a deprecation line) and as read.
OLD_NAMES: dict[str, tuple[str, Any]] = {
    "http_enabled": ("true", True),
    "http_allowed_domains": ("hooks.example.com, *.Example.ORG", ("hooks.example.com", "*.example.org")),
    "http_allow_private_addresses": ("yes", True),
    "http_allow_insecure": ("1", True),
    "http_timeout_seconds": ("7.5", 7.5),
    "http_max_per_host": ("3", 3),
    "http_max_per_fast_host": ("40", 40),
}


def variable(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def deprecation_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "deprecated" in r.message
    ]


def test_every_renamed_setting_is_tried_here_and_listed_on_the_configuration_page() -> None:
    assert set(OLD_NAMES) == set(RENAMED_SETTINGS)
    page = CONFIGURATION_PAGE.read_text()
    for old, new in RENAMED_SETTINGS.items():
        assert new in Settings.model_fields and old not in Settings.model_fields, old
        assert f"| `{variable(old)}` | `{variable(new)}`" in page, old


@pytest.mark.parametrize("old", list(OLD_NAMES))
def test_an_old_variable_is_read_as_the_new_one_with_one_deprecation_line(
    old: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    given, read = OLD_NAMES[old]
    new = RENAMED_SETTINGS[old]
    monkeypatch.setenv(variable(old), given)
    with caplog.at_level(logging.WARNING):
        settings = load_settings()
    assert getattr(settings, new) == read
    (line,) = deprecation_lines(caplog)
    assert variable(old) in line and variable(new) in line
    assert given not in line and given.split(",")[0] not in line
    assert unknown_setting_warnings() == []  # an old name is no unknown one


def test_old_keys_of_the_config_file_are_read_as_the_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_config(
        tmp_path, "".join(f"{old} = {given!r}\n" for old, (given, _) in OLD_NAMES.items()), monkeypatch
    )
    with caplog.at_level(logging.WARNING):
        settings = load_settings()
    for old, (_, read) in OLD_NAMES.items():
        assert getattr(settings, RENAMED_SETTINGS[old]) == read, old
    lines = deprecation_lines(caplog)
    assert len(lines) == len(OLD_NAMES)
    for old, line in zip(OLD_NAMES, lines, strict=True):
        assert line.startswith(f"{old} (in the XMTP_PUSH_CONFIG file) is deprecated"), line
        assert RENAMED_SETTINGS[old] in line and OLD_NAMES[old][0] not in line
    assert unknown_setting_warnings() == []


def test_new_names_give_no_deprecation_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLED", "true")
    with caplog.at_level(logging.WARNING):
        assert load_settings().webhook_enabled
    assert deprecation_lines(caplog) == []


def test_keyword_values_under_an_old_name_are_read_as_the_new_one() -> None:
    assert Settings(http_enabled=True, http_max_per_host=3).webhook_max_per_host == 3  # type: ignore[call-arg]
    assert load_settings(http_timeout_seconds=2.5).provider_timeout_seconds == 2.5


def test_both_names_with_different_values_are_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_HTTP_MAX_PER_HOST", "3")
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_MAX_PER_HOST", "4")
    with pytest.raises(SettingsError) as raised:
        load_settings()
    message = str(raised.value)
    assert "XMTP_PUSH_HTTP_MAX_PER_HOST and XMTP_PUSH_WEBHOOK_MAX_PER_HOST" in message
    assert "3" not in message and "4" not in message


def test_both_names_in_the_config_file_with_different_values_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, "http_enabled = true\nwebhook_enabled = false\n", monkeypatch)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "http_enabled (in the XMTP_PUSH_CONFIG file) and webhook_enabled (in the" in str(raised.value)


def test_both_names_with_one_value_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_HTTP_ENABLED", "true")
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLED", "1")  # the same value, written otherwise
    assert load_settings().webhook_enabled


def test_a_variable_under_an_old_name_wins_over_the_files_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, "provider_timeout_seconds = 4\n", monkeypatch)
    monkeypatch.setenv("XMTP_PUSH_HTTP_TIMEOUT_SECONDS", "6")
    assert load_settings().provider_timeout_seconds == 6


def test_a_bad_value_under_an_old_name_is_named_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_HTTP_MAX_PER_HOST", "0")
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert str(raised.value).startswith("invalid configuration: XMTP_PUSH_HTTP_MAX_PER_HOST:")


def test_a_mistyped_old_name_is_pointed_to_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_HTTP_ENABLD", "true")
    assert unknown_setting_warnings() == [
        "XMTP_PUSH_HTTP_ENABLD is not a setting and is ignored (did you mean XMTP_PUSH_WEBHOOK_ENABLED?)"
    ]


def xmtp_push(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    database = asyncio.run(create_sqlite_database(tmp_path))
    env = child_env(database_url=database, **settings)
    return subprocess.run([*command(), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("args", [("config", "check"), ("migrate",)])
def test_a_command_takes_an_old_name_with_one_warning_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = xmtp_push(tmp_path, *args, http_enabled="true", http_allowed_domains="hooks.example.com")
    assert result.returncode == 0, result
    if args == ("config", "check"):
        assert result.stdout.splitlines()[-1] == "configuration is usable"  # webhooks configured
    warnings = [json.loads(line) for line in result.stderr.splitlines() if "deprecated" in line]
    assert [(w["level"], w["event"].split(" is ")[0]) for w in warnings] == [
        ("warning", "XMTP_PUSH_HTTP_ENABLED"),
        ("warning", "XMTP_PUSH_HTTP_ALLOWED_DOMAINS"),
    ]
    assert "hooks.example.com" not in result.stderr


@pytest.mark.slow
def test_config_check_refuses_both_names_with_different_values(tmp_path: Path) -> None:
    result = xmtp_push(tmp_path, "config", "check", http_enabled="true", webhook_enabled="false")
    assert result.returncode == 2, result
    assert (
        "xmtp-push: XMTP_PUSH_HTTP_ENABLED and XMTP_PUSH_WEBHOOK_ENABLED are the old and the new name of one "
        "setting, given different values: keep XMTP_PUSH_WEBHOOK_ENABLED alone"
    ) in result.stderr.splitlines()
