"""The XMTP_PUSH_AUTH_* settings (docs/callers.md#settings): read only while auth is on, each bad
value refused naming the setting and never the value; the real command refuses with exit 2, and exits
10 when the JWKS yields no usable key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.config import SettingsError, load_settings
from tests.support.auth import API_KEY, inline_keys, jwks_server, signing_key
from tests.support.cli import dev_env, run
from tests.support.ops import free_port

SECRET = "s3cret-value-never-shown-0123456789abcdef"
ON = {"XMTP_PUSH_AUTH_ENABLED": "true"}


def error_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    return str(raised.value)


def test_off_no_other_auth_setting_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("API_KEYS", "KEYS", "LEEWAY_SECONDS", "JWKS_URL", "AUDIENCES"):
        monkeypatch.setenv(f"XMTP_PUSH_AUTH_{name}", "{nonsense")
    settings = load_settings()
    assert (settings.auth_api_keys, settings.auth_keys, settings.auth_leeway_seconds) == (None, None, 60)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "XMTP_PUSH_AUTH_ENABLED"),
        ({"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"worker": SECRET[:20]})}, "XMTP_PUSH_AUTH_API_KEYS"),
        ({"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET, "b": SECRET})}, "XMTP_PUSH_AUTH_API_KEYS"),
        ({"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"-bad": SECRET})}, "XMTP_PUSH_AUTH_API_KEYS"),
        ({"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET + "\u00e9"})}, "XMTP_PUSH_AUTH_API_KEYS"),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({str(n): f"{SECRET}{n}" for n in range(257)})},
            "XMTP_PUSH_AUTH_API_KEYS",
        ),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": "env:XMTP_TEST_UNSET_KEY"})},
            "XMTP_PUSH_AUTH_API_KEYS",
        ),
        ({"XMTP_PUSH_AUTH_API_KEYS": "/no/such/file"}, "XMTP_PUSH_AUTH_API_KEYS"),
        ({"XMTP_PUSH_AUTH_KEYS": "[]"}, "XMTP_PUSH_AUTH_KEYS"),
        (
            {"XMTP_PUSH_AUTH_KEYS": json.dumps([{"kid": "a", "alg": "HS256", "public_key": "x"}])},
            "XMTP_PUSH_AUTH_KEYS",
        ),
        (
            {"XMTP_PUSH_AUTH_KEYS": inline_keys(signing_key("ES256", "a"), signing_key("EdDSA", "a"))},
            "XMTP_PUSH_AUTH_KEYS",
        ),
        (
            {"XMTP_PUSH_AUTH_KEYS": inline_keys(signing_key("ES384", "a")).replace("ES384", "ES256")},
            "XMTP_PUSH_AUTH_KEYS",
        ),
        (
            {
                "XMTP_PUSH_AUTH_KEYS": inline_keys(signing_key("ES256")),
                "XMTP_PUSH_AUTH_JWKS_URL": "https://a.example/j",
            },
            "XMTP_PUSH_AUTH_KEYS",
        ),
        ({"XMTP_PUSH_AUTH_JWKS_URL": f"http://auth.example/{SECRET}"}, "XMTP_PUSH_AUTH_JWKS_URL"),
        ({"XMTP_PUSH_AUTH_JWKS_URL": f"ftp://auth.example/{SECRET}"}, "XMTP_PUSH_AUTH_JWKS_URL"),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}), "XMTP_PUSH_AUTH_AUDIENCES": " , "},
            "XMTP_PUSH_AUTH_AUDIENCES",
        ),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}), "XMTP_PUSH_AUTH_ISSUERS": ""},
            "XMTP_PUSH_AUTH_ISSUERS",
        ),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}), "XMTP_PUSH_AUTH_LEEWAY_SECONDS": "301"},
            "XMTP_PUSH_AUTH_LEEWAY_SECONDS",
        ),
        (
            {"XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}), "XMTP_PUSH_AUTH_LEEWAY_SECONDS": "1.5"},
            "XMTP_PUSH_AUTH_LEEWAY_SECONDS",
        ),
        (
            {
                "XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}),
                "XMTP_PUSH_AUTH_JWKS_REFRESH_SECONDS": "0",
            },
            "XMTP_PUSH_AUTH_JWKS_REFRESH_SECONDS",
        ),
        (
            {
                "XMTP_PUSH_AUTH_API_KEYS": json.dumps({"a": SECRET}),
                "XMTP_PUSH_AUTH_JWKS_REFRESH_SECONDS": "100",
                "XMTP_PUSH_AUTH_JWKS_MAX_STALE_SECONDS": "119",
            },
            "XMTP_PUSH_AUTH_JWKS_MAX_STALE_SECONDS",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting_not_the_value(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    message = error_for(monkeypatch, **ON, **env)
    assert named in message
    assert SECRET not in message and "s3cret" not in message


def test_keys_from_variables_and_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APP_PUSH_KEY", API_KEY)
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"worker": "env:APP_PUSH_KEY", "other": SECRET}))
    monkeypatch.setenv("XMTP_PUSH_AUTH_ENABLED", "true")
    monkeypatch.setenv("XMTP_PUSH_AUTH_API_KEYS", str(keys_file))
    monkeypatch.setenv("XMTP_PUSH_AUTH_REQUIRED_SCOPES", "a, b")
    settings = load_settings()
    assert [(key.name, key.value) for key in settings.auth_api_keys or ()] == [
        ("worker", API_KEY.encode()),
        ("other", SECRET.encode()),
    ]
    assert settings.auth_required_scopes == ("a", "b")
    assert SECRET not in repr(settings)


@pytest.mark.slow
def test_the_command_refuses_a_bad_key_with_exit_2_and_one_line(tmp_path: Path) -> None:
    env = dev_env(
        tmp_path, free_port(), free_port(), **ON, XMTP_PUSH_AUTH_API_KEYS=json.dumps({"worker": SECRET[:20]})
    )
    result = run(["dev"], env, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        'xmtp-push: invalid configuration: XMTP_PUSH_AUTH_API_KEYS: key "worker" is shorter than 32 bytes'
    )
    assert SECRET[:20] not in result.stderr + result.stdout


@pytest.mark.slow
def test_the_command_exits_10_when_the_jwks_has_no_usable_key(tmp_path: Path) -> None:
    with jwks_server(signing_key("ES256")) as server:
        server.status = 503
        env = dev_env(tmp_path, free_port(), free_port(), **ON, XMTP_PUSH_AUTH_JWKS_URL=server.url)
        result = run(["dev"], env, tmp_path)
        assert server.requests == 3
    assert result.returncode == 10
    assert result.stderr.strip().splitlines()[-1] == (
        "xmtp-push: XMTP_PUSH_AUTH_JWKS_URL: no usable key set from 127.0.0.1 after 3 tries (HTTP 503)"
    )


@pytest.mark.slow
def test_config_check_fetches_the_jwks_once(tmp_path: Path) -> None:
    with jwks_server(signing_key("ES256")) as server:
        env = dev_env(tmp_path, free_port(), free_port(), **ON, XMTP_PUSH_AUTH_JWKS_URL=server.url)
        result = run(["config", "check", "--role", "dev"], env, tmp_path)
        assert server.requests == 1
        assert "JWT keys: 1 from 127.0.0.1" in result.stdout
        server.status = 503
        failed = run(["config", "check", "--role", "dev"], env, tmp_path)
    assert failed.returncode == 10, failed.stdout + failed.stderr
