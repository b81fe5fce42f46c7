"""Settings: XMTP_PUSH_* variables, the optional TOML file, defaults and error messages (docs/configuration.md#configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.config import Settings, SettingsError, load_settings, unknown_setting_warnings
from app.core.proxies import MALFORMED_PROXY, Proxy
from app.delivery.egress import EgressProxy
from tests.support.settings import clean_environment, write_config  # noqa: F401  (a fixture, autouse)

SECRET = "sk_live_Zq9xVERYSECRET0000"


def error_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    return str(raised.value)


# --- defaults ------------------------------------------------------------------------------------


def test_defaults_match_the_operations_table() -> None:
    settings = load_settings()
    assert settings.database_url == "sqlite+aiosqlite:///./xmtp-push.db"
    assert settings.redis_url is None
    assert (settings.http_host, settings.http_port) == ("127.0.0.1", 8080)
    assert (settings.grpc_host, settings.grpc_port) == ("127.0.0.1", 50051)
    assert settings.ingest_token is None
    assert settings.recipient_ttl_seconds == 2_592_000
    assert settings.max_attempts == 15
    assert settings.retry_window_seconds == 3600
    assert settings.max_push_topics == 100_000
    assert settings.apns_key is None
    assert settings.apns_environment == "production"
    assert settings.apns_endpoint is None
    assert settings.apns_ca_file is None
    assert settings.fcm_service_account is None
    assert settings.fcm_endpoint == "https://fcm.googleapis.com"
    assert settings.webhook_enabled is False
    assert settings.webhook_allowed_domains == ()
    assert settings.webhook_allow_private_addresses is False
    assert settings.webhook_allow_insecure is False
    assert settings.xmtpd_address is None
    assert settings.xmtpd_tls is True
    assert settings.xmtpd_keepalive_timeout_seconds == 90
    assert settings.xmtpd_catchup_max_age_seconds == 600
    assert settings.is_sqlite


def test_no_channel_is_configured_by_default() -> None:
    settings = load_settings()
    assert not settings.apns_configured
    assert not settings.fcm_configured
    assert not settings.webhook_enabled


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        settings.max_attempts = 5


# --- environment ---------------------------------------------------------------------------------


def test_environment_variables_use_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "XMTP_PUSH_DATABASE_URL": "postgresql+asyncpg://push@db.internal/push",
        "XMTP_PUSH_REDIS_URL": "redis://redis.internal:6379/0",
        "XMTP_PUSH_HTTP_HOST": "0.0.0.0",
        "XMTP_PUSH_HTTP_PORT": "9090",
        "XMTP_PUSH_GRPC_HOST": "::",
        "XMTP_PUSH_GRPC_PORT": "6000",
        "XMTP_PUSH_INGEST_TOKEN": "ingest-token",
        "XMTP_PUSH_RECIPIENT_TTL_SECONDS": "86400",
        "XMTP_PUSH_MAX_ATTEMPTS": "10",
        "XMTP_PUSH_MAX_PUSH_TOPICS": "5",
        "XMTP_PUSH_APNS_ENVIRONMENT": "sandbox",
        "XMTP_PUSH_APNS_ENDPOINT": "https://apns.staging.internal",
        "XMTP_PUSH_APNS_CA_FILE": "/etc/ca.pem",
        "XMTP_PUSH_FCM_ENDPOINT": "https://fcm.staging.internal",
        "XMTP_PUSH_WEBHOOK_ENABLED": "true",
        "XMTP_PUSH_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "1",
        "XMTP_PUSH_WEBHOOK_ALLOW_INSECURE": "yes",
        "XMTP_PUSH_XMTPD_ADDRESS": "xmtpd.internal:5050",
        "XMTP_PUSH_XMTPD_TLS": "false",
        "XMTP_PUSH_XMTPD_KEEPALIVE_TIMEOUT_SECONDS": "30",
        "XMTP_PUSH_XMTPD_CATCHUP_MAX_AGE_SECONDS": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.database_url == "postgresql+asyncpg://push@db.internal/push"
    assert not settings.is_sqlite
    assert settings.redis_url == "redis://redis.internal:6379/0"
    assert (settings.http_host, settings.http_port) == ("0.0.0.0", 9090)
    assert (settings.grpc_host, settings.grpc_port) == ("::", 6000)
    assert settings.ingest_token == "ingest-token"
    assert settings.recipient_ttl_seconds == 86_400
    assert settings.max_attempts == 10
    assert settings.max_push_topics == 5
    assert settings.apns_environment == "sandbox"
    assert settings.apns_endpoint == "https://apns.staging.internal"
    assert settings.apns_ca_file == "/etc/ca.pem"
    assert settings.fcm_endpoint == "https://fcm.staging.internal"
    assert (
        settings.webhook_enabled
        and settings.webhook_allow_private_addresses
        and settings.webhook_allow_insecure
    )
    assert settings.xmtpd_address == "xmtpd.internal:5050"
    assert settings.xmtpd_tls is False
    assert settings.xmtpd_keepalive_timeout_seconds == 30
    assert settings.xmtpd_catchup_max_age_seconds == 0


def test_environment_variable_names_are_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("xmtp_push_max_attempts", "7")
    assert load_settings().max_attempts == 7


def test_variables_without_the_prefix_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_ATTEMPTS", "9")
    monkeypatch.setenv("DATABASE_URL", "postgresql+asyncpg://elsewhere/db")
    settings = load_settings()
    assert settings.max_attempts == 15
    assert settings.database_url == "sqlite+aiosqlite:///./xmtp-push.db"


def test_unknown_prefixed_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_NO_SUCH_SETTING", "x")
    assert load_settings().max_attempts == 15


def test_allowed_domains_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ALLOWED_DOMAINS", " hooks.example.com, *.Example.ORG ,,")
    assert load_settings().webhook_allowed_domains == ("hooks.example.com", "*.example.org")


def test_single_allowed_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ALLOWED_DOMAINS", "hooks.example.com")
    assert load_settings().webhook_allowed_domains == ("hooks.example.com",)


def test_empty_allowed_domains_variable_means_any_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ALLOWED_DOMAINS", "")
    assert load_settings().webhook_allowed_domains == ()


def test_empty_redis_url_means_the_in_process_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # `XMTP_PUSH_REDIS_URL=` (as compose files often write it) is the same as unset.
    monkeypatch.setenv("XMTP_PUSH_REDIS_URL", "")
    assert load_settings().redis_url is None


@pytest.mark.parametrize("url", ["redis://r:6379/0", "rediss://r:6380", "unix:///run/redis.sock"])
def test_redis_url_schemes(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("XMTP_PUSH_REDIS_URL", url)
    assert load_settings().redis_url == url


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_MAX_ATTEMPTS", "4")
    assert load_settings(max_attempts=6).max_attempts == 6


# --- ranges --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "3", "10", "50"])
def test_max_attempts_range_accepts(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("XMTP_PUSH_MAX_ATTEMPTS", value)
    assert load_settings().max_attempts == int(value)


@pytest.mark.parametrize("value", ["0", "51", "-1", "three", "2.5", ""])
def test_max_attempts_range_refuses(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    message = error_for(monkeypatch, XMTP_PUSH_MAX_ATTEMPTS=value)
    assert "XMTP_PUSH_MAX_ATTEMPTS" in message


def test_recipient_ttl_has_a_one_day_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_RECIPIENT_TTL_SECONDS", "86400")
    assert load_settings().recipient_ttl_seconds == 86_400
    assert "XMTP_PUSH_RECIPIENT_TTL_SECONDS" in error_for(
        monkeypatch, XMTP_PUSH_RECIPIENT_TTL_SECONDS="86399"
    )


def test_max_push_topics_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "XMTP_PUSH_MAX_PUSH_TOPICS" in error_for(monkeypatch, XMTP_PUSH_MAX_PUSH_TOPICS="0")


@pytest.mark.parametrize("name", ["XMTP_PUSH_HTTP_PORT", "XMTP_PUSH_GRPC_PORT"])
@pytest.mark.parametrize("value", ["65536", "-1", "http"])
def test_ports_must_be_ports(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    assert name in error_for(monkeypatch, **{name: value})


@pytest.mark.parametrize("name", ["XMTP_PUSH_HTTP_PORT", "XMTP_PUSH_GRPC_PORT"])
def test_port_zero_picks_a_free_port(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "0")
    settings = load_settings()
    assert (settings.http_port if "HTTP" in name else settings.grpc_port) == 0


def test_apns_environment_is_production_or_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "XMTP_PUSH_APNS_ENVIRONMENT" in error_for(monkeypatch, XMTP_PUSH_APNS_ENVIRONMENT="staging")


@pytest.mark.parametrize(
    "url", ["mysql://db/push", "postgresql://db/push", "sqlite:///push.db", "postgresql+psycopg://db/push"]
)
def test_database_url_must_be_an_async_driver(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    assert "XMTP_PUSH_DATABASE_URL" in error_for(monkeypatch, XMTP_PUSH_DATABASE_URL=url)


def test_bad_boolean_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "XMTP_PUSH_WEBHOOK_ENABLED" in error_for(monkeypatch, XMTP_PUSH_WEBHOOK_ENABLED="maybe")


# --- error messages ------------------------------------------------------------------------------


def test_error_names_the_setting_and_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    message = error_for(monkeypatch, XMTP_PUSH_MAX_ATTEMPTS="0")
    assert message.startswith("invalid configuration")
    assert "XMTP_PUSH_MAX_ATTEMPTS" in message
    assert "Traceback" not in message


def test_every_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    message = error_for(
        monkeypatch,
        XMTP_PUSH_MAX_ATTEMPTS="0",
        XMTP_PUSH_RECIPIENT_TTL_SECONDS="10",
        XMTP_PUSH_HTTP_PORT="nope",
    )
    for name in ("XMTP_PUSH_MAX_ATTEMPTS", "XMTP_PUSH_RECIPIENT_TTL_SECONDS", "XMTP_PUSH_HTTP_PORT"):
        assert name in message
    assert "XMTP_PUSH_MAX_PUSH_TOPICS" not in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("XMTP_PUSH_MAX_ATTEMPTS", SECRET),
        ("XMTP_PUSH_HTTP_PORT", SECRET),
        ("XMTP_PUSH_WEBHOOK_ENABLED", SECRET),
        ("XMTP_PUSH_APNS_ENVIRONMENT", SECRET),
        ("XMTP_PUSH_DATABASE_URL", f"mysql://admin:{SECRET}@db.internal/push"),
        ("XMTP_PUSH_REDIS_URL", f"http://:{SECRET}@redis.internal:6379"),
    ],
)
def test_error_never_contains_the_bad_value(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    message = error_for(monkeypatch, **{name: value})
    assert name in message
    assert SECRET not in message
    assert "VERYSECRET" not in message


def test_settings_error_has_no_chained_validation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pydantic error (which holds the input) must not ride along in a traceback.
    monkeypatch.setenv("XMTP_PUSH_MAX_ATTEMPTS", SECRET)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


# --- TOML file -----------------------------------------------------------------------------------


def test_config_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(
        tmp_path,
        'max_attempts = 5\nhttp_port = 9000\nwebhook_enabled = true\nwebhook_allowed_domains = ["*.Example.org"]\n'
        'database_url = "postgresql+asyncpg://push@db/push"\n',
        monkeypatch,
    )
    settings = load_settings()
    assert settings.max_attempts == 5
    assert settings.http_port == 9000
    assert settings.webhook_enabled is True
    assert settings.webhook_allowed_domains == ("*.example.org",)
    assert settings.database_url == "postgresql+asyncpg://push@db/push"
    assert settings.grpc_port == 50051  # untouched settings keep their defaults


def test_config_file_allowed_domains_may_be_a_comma_separated_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, 'webhook_allowed_domains = "a.example.com, *.example.org"\n', monkeypatch)
    assert load_settings().webhook_allowed_domains == ("a.example.com", "*.example.org")


def test_environment_wins_over_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, "max_attempts = 5\nmax_push_topics = 50\n", monkeypatch)
    monkeypatch.setenv("XMTP_PUSH_MAX_ATTEMPTS", "7")
    settings = load_settings()
    assert settings.max_attempts == 7
    assert settings.max_push_topics == 50


def test_bad_value_in_the_config_file_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(
        tmp_path, f'max_attempts = 0\ningest_token = "{SECRET}"\nhttp_port = "{SECRET}"\n', monkeypatch
    )
    with pytest.raises(SettingsError) as raised:
        load_settings()
    message = str(raised.value)
    # Named as the file spells them: the environment variables were not set.
    assert "max_attempts (in the XMTP_PUSH_CONFIG file):" in message
    assert "http_port (in the XMTP_PUSH_CONFIG file):" in message
    assert "XMTP_PUSH_MAX_ATTEMPTS" not in message and "XMTP_PUSH_HTTP_PORT" not in message
    assert SECRET not in message


def test_a_bad_variable_that_wins_over_the_file_is_named_as_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, "max_attempts = 3\n", monkeypatch)
    message = error_for(monkeypatch, XMTP_PUSH_MAX_ATTEMPTS="0")
    assert "XMTP_PUSH_MAX_ATTEMPTS:" in message and "(in the XMTP_PUSH_CONFIG file)" not in message


def test_messages_lose_pydantics_value_error_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    message = error_for(monkeypatch, XMTP_PUSH_DATABASE_URL="mysql://db/x")
    assert message == (
        "invalid configuration: XMTP_PUSH_DATABASE_URL: "
        "must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL"
    )
    assert "Value error" not in error_for(monkeypatch, XMTP_PUSH_REDIS_URL="http://x")


@pytest.mark.parametrize(
    "url",
    ["postgresql+asyncpg://u:p4ss@db:port/x", "postgresql+asyncpg://u:p4ss@[::1/x", "redis://u:p4ss@r:x/0"],
)
def test_a_malformed_url_is_a_settings_error_without_the_url(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    name = "XMTP_PUSH_REDIS_URL" if url.startswith("redis") else "XMTP_PUSH_DATABASE_URL"
    message = error_for(monkeypatch, **{name: url})
    assert f"{name}: not a well-formed URL" in message
    assert "p4ss" not in message


# --- names that are no setting -------------------------------------------------------------------


def test_a_mistyped_variable_is_warned_about_with_the_nearest_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLD", "true")
    monkeypatch.setenv("XMTP_PUSH_NO_SUCH_THING_AT_ALL", "x")
    monkeypatch.setenv("XMTP_PUSH_TEST_SOMETHING", "x")  # the test suite's own variables
    assert unknown_setting_warnings() == [
        "XMTP_PUSH_NO_SUCH_THING_AT_ALL is not a setting and is ignored",
        "XMTP_PUSH_WEBHOOK_ENABLD is not a setting and is ignored (did you mean XMTP_PUSH_WEBHOOK_ENABLED?)",
    ]


def test_an_unknown_toml_key_is_warned_about_with_the_nearest_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, "max_atempts = 3\nhttp_port = 9000\n", monkeypatch)
    assert unknown_setting_warnings() == [
        "max_atempts (in the XMTP_PUSH_CONFIG file) is not a setting and is ignored (did you mean max_attempts?)"
    ]


def test_known_names_give_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # keys are case-blind too
    write_config(tmp_path, "max_attempts = 3\nWEBHOOK_ENABLED = true\n", monkeypatch)
    assert load_settings().webhook_enabled
    monkeypatch.setenv("XMTP_PUSH_HTTP_PORT", "9000")
    monkeypatch.setenv("xmtp_push_grpc_port", "9001")  # names are case-insensitive
    assert unknown_setting_warnings() == []


def test_missing_config_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "XMTP_PUSH_CONFIG" in str(raised.value)
    assert "not found" in str(raised.value)


def test_config_that_is_a_folder_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_CONFIG", str(tmp_path))
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "XMTP_PUSH_CONFIG" in str(raised.value)


def test_malformed_config_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, f'ingest_token = "{SECRET}"\nmax_attempts = \n', monkeypatch)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert "XMTP_PUSH_CONFIG" in str(raised.value)
    assert SECRET not in str(raised.value)


def test_empty_config_variable_means_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_CONFIG", "")
    assert load_settings().max_attempts == 15


# --- channels ------------------------------------------------------------------------------------

APNS = {
    "XMTP_PUSH_APNS_KEY": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
    "XMTP_PUSH_APNS_KEY_ID": "KEYID12345",
    "XMTP_PUSH_APNS_TEAM_ID": "TEAMID1234",
    "XMTP_PUSH_APNS_BUNDLE_ID": "org.example.app",
}


def test_apns_is_configured_with_all_four_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in APNS.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.apns_configured
    assert not settings.fcm_configured


@pytest.mark.parametrize("missing", sorted(APNS))
def test_apns_is_not_configured_when_one_is_missing(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    for name, value in APNS.items():
        if name != missing:
            monkeypatch.setenv(name, value)
    assert not load_settings().apns_configured


@pytest.mark.parametrize("missing", sorted(APNS))
def test_apns_is_not_configured_when_one_is_empty(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    for name, value in APNS.items():
        monkeypatch.setenv(name, "" if name == missing else value)
    assert not load_settings().apns_configured


def test_fcm_is_configured_by_the_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_FCM_SERVICE_ACCOUNT", '{"project_id": "p"}')
    settings = load_settings()
    assert settings.fcm_configured
    assert not settings.apns_configured


def test_empty_fcm_service_account_is_not_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_FCM_SERVICE_ACCOUNT", "")
    assert not load_settings().fcm_configured


def test_webhook_channel_needs_webhook_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ALLOWED_DOMAINS", "*.example.org")
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ALLOW_INSECURE", "true")
    assert load_settings().webhook_enabled is False
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLED", "true")
    assert load_settings().webhook_enabled is True
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLED", "false")
    assert load_settings().webhook_enabled is False


def test_channels_can_come_from_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(
        tmp_path,
        'apns_key = "pem"\napns_key_id = "K"\napns_team_id = "T"\napns_bundle_id = "b"\n'
        'fcm_service_account = \'{"project_id": "p"}\'\nwebhook_enabled = true\n',
        monkeypatch,
    )
    settings = load_settings()
    assert settings.apns_configured and settings.fcm_configured and settings.webhook_enabled


def test_settings_class_accepts_keyword_values() -> None:
    settings = Settings(database_url="sqlite+aiosqlite:///x.db", http_port=0, max_attempts=1)
    assert (settings.http_port, settings.max_attempts) == (0, 1)


# --- egress proxies ------------------------------------------------------------------------------


def test_the_environments_proxy_variables_are_read_without_the_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("https_proxy", "http://ops:pa%40ss@proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost, .internal")
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_PROXY", "egress.internal:8080")
    settings = load_settings()
    proxy = EgressProxy.for_providers(settings)
    assert proxy.for_url("https://api.push.apple.com/3/device/x") == proxy.proxy
    assert proxy.proxy is not None and proxy.proxy.address == "proxy.internal:3128"
    assert proxy.proxy.headers == {"Proxy-Authorization": "Basic b3BzOnBhQHNz"}
    assert proxy.for_url("https://hooks.internal/a") is None  # a listed suffix
    assert proxy.for_url("https://localhost:8443/") is None
    assert proxy.for_url("http://fcm.example.org/") is None  # only https:// is tunnelled
    assert EgressProxy.for_webhooks(settings).for_url("https://hooks.example.org/") == Proxy(
        "egress.internal", 8080
    )
    assert EgressProxy.for_webhooks(load_settings(webhook_proxy="")).proxy is None
    # The URLs hold a password: the settings never show them.
    assert "pa%40ss" not in repr(settings) and "pa%40ss" not in str(proxy)
    assert unknown_setting_warnings() == []


def test_a_sygnal_yaml_proxy_wins_over_https_proxy_and_no_proxy_star_bypasses_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    settings = load_settings()
    assert EgressProxy.for_providers(settings, "http://other:1").for_host("fcm.googleapis.com") == Proxy(
        "other", 1
    )
    monkeypatch.setenv("NO_PROXY", "*")
    assert EgressProxy.for_providers(load_settings()).for_host("fcm.googleapis.com") is None


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "XMTP_PUSH_WEBHOOK_PROXY"])
@pytest.mark.parametrize(
    "url",
    [
        "socks5://ops:secret@proxy:1080",
        "https://ops:secret@proxy:3128",
        "http://ops:secret@:3128",
        "http://ops:secret@proxy:99999",
    ],
)
def test_a_proxy_url_that_is_not_http_is_refused_without_quoting_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, url: str
) -> None:
    message = error_for(monkeypatch, **{variable: url})
    assert message == f"invalid configuration: {variable}: {MALFORMED_PROXY}"
    assert "secret" not in message
