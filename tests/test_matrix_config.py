"""The gateway's config file: Sygnal's `apps:` read as Sygnal reads it, and every way it can be wrong.

Each error stops start-up with a message naming the app and the key, never a secret's value.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.core.config import Settings, SettingsError
from app.delivery.types import OutcomeKind
from app.matrix.apps import AppTable, glob_pattern
from app.matrix.config import APP_TYPES, GatewayAddress, HttpSection, gateway_address, load_gateway_config
from app.ops.checks import Check, matrix_check
from app.ops.failures import INVALID_CONFIGURATION
from fakes.fake_apns import FakeApns
from fakes.tls import TlsFiles
from tests.support.matrix import (
    device,
    event_id_only,
    gateway_settings,
    running,
    write_config,
    write_key_files,
)

SECRET = "do-not-print-me"
SETTINGS = Settings(database_url="sqlite+aiosqlite:///unused.db")
ENDPOINT = "https://127.0.0.1:9"


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    return write_key_files(tmp_path)


def apns_values(path: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "type": "apns",
        "keyfile": path,
        "key_id": "K",
        "team_id": "T",
        "topic": "org.x",
    }
    values.update(overrides)
    return {key: value for key, value in values.items() if value is not None}


def gcm_values(path: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "type": "gcm",
        "api_version": "v1",
        "project_id": "p",
        "service_account_file": path,
    }
    values.update(overrides)
    return {key: value for key, value in values.items() if value is not None}


def load(tmp_path: Path, document: Any) -> Any:
    path = tmp_path / "apps.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False))
    return load_gateway_config(str(path))


def error_of(tmp_path: Path, document: Any) -> str:
    with pytest.raises(SettingsError) as raised:
        load(tmp_path, document)
    message = str(raised.value)
    assert message.startswith("XMTP_PUSH_MATRIX_APPS")
    assert SECRET not in message and "BEGIN" not in message
    return message


# --------------------------------------------------------------------------- what is read


def test_a_whole_sygnal_config_is_read_for_its_apps_with_one_warning(
    tmp_path: Path, files: tuple[str, str]
) -> None:
    keyfile, account = files
    document = {
        "log": {"setup": {"version": 1}},
        "http": {"bind_addresses": ["127.0.0.1"], "port": 5000},
        "metrics": {"prometheus": {"enabled": True}},
        "proxy": "http://user:secret@proxy.example.org:3128",
        "apps": {"org.ios": apns_values(keyfile), "org.android": gcm_values(account)},
    }
    config = load(tmp_path, document)
    assert config.proxy == "http://user:secret@proxy.example.org:3128"
    assert "secret" not in repr(config)
    assert [app.app_id for app in config.apps.apps] == ["org.ios", "org.android"]
    assert [(app.type, app.channel) for app in config.apps.apps] == [("apns", "apns"), ("gcm", "fcm")]
    assert config.warnings == [
        "XMTP_PUSH_MATRIX_APPS: only the apps, proxy and http sections are read; ignored: log, metrics"
    ]
    assert config.http == HttpSection(("127.0.0.1",), 5000)


def settings_of(**explicit: Any) -> Settings:
    return Settings(database_url="sqlite+aiosqlite:///unused.db", matrix_apps="sygnal.yaml", **explicit)


def test_the_gateway_listens_where_the_settings_else_the_http_section_else_sygnal_says() -> None:
    section = HttpSection(("0.0.0.0", "::"), 5001)
    file_names = ("http.bind_addresses of XMTP_PUSH_MATRIX_APPS", "http.port of XMTP_PUSH_MATRIX_APPS")
    assert gateway_address(settings_of(), section) == GatewayAddress(("0.0.0.0", "::"), 5001, *file_names)
    assert gateway_address(settings_of(), HttpSection()) == GatewayAddress(
        ("127.0.0.1",), 5000, "Sygnal's default address", "Sygnal's default port"
    )
    assert gateway_address(settings_of(http_port=8080), section) == GatewayAddress(
        ("0.0.0.0", "::"), 8080, file_names[0], "XMTP_PUSH_HTTP_PORT"
    )
    explicit = gateway_address(settings_of(http_host="127.0.0.1", http_port=0), HttpSection(port=5001))
    assert explicit == GatewayAddress(("127.0.0.1",), 0, "XMTP_PUSH_HTTP_HOST", "XMTP_PUSH_HTTP_PORT")
    # Our own default port (8080) is no setting: the file's, or Sygnal's, wins over it.
    assert settings_of().http_port == 8080


@pytest.mark.parametrize(
    ("http", "expected"),
    [
        ("5000", "XMTP_PUSH_MATRIX_APPS: http: must be a mapping (bind_addresses, port)"),
        ({"port": "5000"}, "XMTP_PUSH_MATRIX_APPS: http.port: must be a port number (0 to 65535)"),
        ({"port": 70000}, "XMTP_PUSH_MATRIX_APPS: http.port: must be a port number (0 to 65535)"),
        (
            {"bind_addresses": "0.0.0.0"},
            "XMTP_PUSH_MATRIX_APPS: http.bind_addresses: must be a list of addresses",
        ),
        ({"bind_addresses": []}, "XMTP_PUSH_MATRIX_APPS: http.bind_addresses: must be a list of addresses"),
    ],
)
def test_a_bad_http_section_stops_start_up_naming_the_key(
    tmp_path: Path, files: tuple[str, str], http: object, expected: str
) -> None:
    keyfile, _ = files
    assert error_of(tmp_path, {"http": http, "apps": {"org.ios": apns_values(keyfile)}}) == expected


def test_an_unknown_http_key_is_a_warning(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, _ = files
    config = load(tmp_path, {"http": {"port": 5001, "tls": True}, "apps": {"org.ios": apns_values(keyfile)}})
    assert config.warnings == ["XMTP_PUSH_MATRIX_APPS: http: unknown keys ignored: tls"]
    assert config.http == HttpSection(None, 5001)


@pytest.mark.parametrize("proxy", ["socks5://user:secret@proxy:1080", "https://user:secret@proxy", 3128])
def test_a_proxy_that_is_no_http_url_stops_start_up_unquoted(
    tmp_path: Path, files: tuple[str, str], proxy: object
) -> None:
    keyfile, _ = files
    with pytest.raises(SettingsError) as raised:
        load(tmp_path, {"proxy": proxy, "apps": {"org.ios": apns_values(keyfile)}})
    assert str(raised.value) == (
        "XMTP_PUSH_MATRIX_APPS: proxy: must be an http:// proxy URL with a host, as http://[user:password@]host:port"
    )


def test_a_file_of_only_apps_has_no_warning_and_defaults(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, account = files
    config = load(tmp_path, {"apps": {"org.ios": apns_values(keyfile), "org.android": gcm_values(account)}})
    assert config.warnings == []
    ios, android = config.apps.apps
    assert ios.inflight_request_limit == android.inflight_request_limit == 512
    assert ios.credentials.endpoint == "https://api.push.apple.com"
    assert ios.credentials.bundle_id == "org.x"
    assert android.credentials.project_id == "p"  # the configured project, as Sygnal
    assert ios.rejecting == {OutcomeKind.DEAD, OutcomeKind.MISMATCH}
    assert android.rejecting == {OutcomeKind.DEAD}


def test_sandbox_endpoint_ca_file_and_limit(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, account = files
    apps = {
        "a": apns_values(keyfile, platform="sandbox", inflight_request_limit=3),
        "b": apns_values(keyfile, endpoint=ENDPOINT, ca_file=account),
        "c": gcm_values(
            account, endpoint="http://127.0.0.1:9", max_connections=4, fcm_options={"android": {}}
        ),
    }
    a, b, c = load(tmp_path, {"apps": apps}).apps.apps
    assert (a.credentials.endpoint, a.inflight_request_limit) == ("https://api.sandbox.push.apple.com", 3)
    assert (b.credentials.endpoint, b.credentials.ca_file) == (ENDPOINT, account)
    assert c.credentials.endpoint == "http://127.0.0.1:9"


def test_unknown_keys_are_warned_by_name(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, account = files
    apps = {
        "a": apns_values(keyfile, colour="blue", api_key=SECRET),
        "b": gcm_values(account, api_key=SECRET),
    }
    config = load(tmp_path, {"apps": apps})
    assert config.warnings == ["XMTP_PUSH_MATRIX_APPS: apps.a: unknown keys ignored: api_key, colour"]


def test_send_badge_counts_is_read_by_apns_and_gcm_apps_without_a_warning(
    tmp_path: Path, files: tuple[str, str]
) -> None:
    keyfile, account = files
    apps = {
        "a": apns_values(keyfile, send_badge_counts=False),
        "b": gcm_values(account, send_badge_counts=False),
        "c": apns_values(keyfile, send_badge_counts=True),
    }
    assert load(tmp_path, {"apps": apps}).warnings == []
    message = error_of(tmp_path, {"apps": {"a": apns_values(keyfile, send_badge_counts="no")}})
    assert message == "XMTP_PUSH_MATRIX_APPS: apps.a.send_badge_counts: must be true or false"


def test_every_type_has_its_keys() -> None:
    assert set(APP_TYPES) >= {"apns", "gcm"}
    assert {"keyfile", "key_id", "team_id", "topic", "platform", "push_type", "certfile"} <= APP_TYPES[
        "apns"
    ].keys
    assert {"convert_device_token_to_hex", "endpoint", "ca_file"} <= APP_TYPES["apns"].keys
    assert {
        "api_version",
        "project_id",
        "service_account_file",
        "fcm_options",
        "max_connections",
    } <= APP_TYPES["gcm"].keys


# --------------------------------------------------------------------------- routing


def test_exact_wins_and_two_globs_are_ambiguous(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, _ = files
    apps = {name: apns_values(keyfile) for name in ["com.x.*", "com.x.ios", "com.*.ios", "org.?", "lit.[a]"]}
    table: AppTable = load(tmp_path, {"apps": apps}).apps
    assert table.find("com.x.ios").app_id == "com.x.ios"  # type: ignore[union-attr]
    assert table.find("com.x.android").app_id == "com.x.*"  # type: ignore[union-attr]
    assert table.find("com.y.ios").app_id == "com.*.ios"  # type: ignore[union-attr]
    assert table.find("com.x.x.ios") is None  # com.x.* and com.*.ios
    assert table.find("org.a").app_id == "org.?"  # type: ignore[union-attr]
    assert table.find("org.ab") is None and table.find("org.") is None
    assert table.find("lit.[a]") is not None and table.find("lit.a") is None  # only * and ? are special
    assert table.find("COM.X.IOS") is None  # case matters


def test_glob_pattern() -> None:
    assert glob_pattern("a*b?").fullmatch("a-anything-bc")
    assert not glob_pattern("a*b?").fullmatch("ab")
    assert glob_pattern("a.b").fullmatch("a.b") and not glob_pattern("a.b").fullmatch("axb")


# --------------------------------------------------------------------------- errors


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="XMTP_PUSH_MATRIX_APPS: file not found or not readable"):
        load_gateway_config(str(tmp_path / "missing.yaml"))
    assert error_of(tmp_path, "apps: [\n") == "XMTP_PUSH_MATRIX_APPS: not a valid YAML file"
    assert "must hold a mapping" in error_of(tmp_path, "- a\n- b\n")
    assert "no apps: section" in error_of(tmp_path, {"log": {}})
    assert "no apps: section" in error_of(tmp_path, {"apps": {}})
    assert "no apps: section" in error_of(tmp_path, {"apps": ["a"]})


def app_error(tmp_path: Path, values: Any, app_id: str = "org.app") -> str:
    message = error_of(tmp_path, {"apps": {app_id: values}})
    assert f"apps.{app_id}" in message
    return message


def test_app_level_errors(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, _ = files
    assert app_error(tmp_path, "apns").endswith("apps.org.app: must be a mapping of keys")
    assert "at most 64 characters" in app_error(tmp_path, apns_values(keyfile), app_id="a" * 65)
    assert app_error(tmp_path, {"keyfile": keyfile}).endswith(
        "apps.org.app.type: required: one of apns, gcm, webpush"
    )
    assert app_error(tmp_path, {"type": "mpns"}).endswith(
        "apps.org.app.type: must be one of apns, gcm, webpush"
    )
    message = app_error(tmp_path, apns_values(keyfile, inflight_request_limit=0))
    assert message.endswith("apps.org.app.inflight_request_limit: must be at least 1")
    message = app_error(tmp_path, apns_values(keyfile, inflight_request_limit="many"))
    assert message.endswith("apps.org.app.inflight_request_limit: must be an integer")


APNS_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"keyfile": None}, "keyfile: required (or certfile, for certificate auth)"),
    ({"key_id": None}, "key_id: required"),
    ({"team_id": None}, "team_id: required"),
    ({"topic": None}, "topic: required"),
    ({"key_id": 12}, "key_id: must be a string"),
    ({"platform": "staging"}, "platform: must be one of production, prod, sandbox"),
    ({"push_type": "loud"}, "push_type: must be one of alert, background, voip"),
    ({"convert_device_token_to_hex": "yes"}, "convert_device_token_to_hex: must be true or false"),
    ({"endpoint": "http://127.0.0.1:9"}, "endpoint: must be an https:// URL"),
    ({"ca_file": "/nonexistent/ca.pem"}, "ca_file: file not found"),
    ({"keyfile": "/nonexistent/AuthKey.p8"}, "keyfile: not a readable PKCS#8 PEM private key"),
    ({"certfile": "/nonexistent/cert.pem"}, "certfile: not a readable PEM certificate with its private key"),
]


@pytest.mark.parametrize(("overrides", "expected"), APNS_ERRORS, ids=[e for _, e in APNS_ERRORS])
def test_apns_errors_name_the_app_and_key(
    tmp_path: Path, files: tuple[str, str], overrides: dict[str, Any], expected: str
) -> None:
    keyfile, _ = files
    assert expected in app_error(tmp_path, apns_values(keyfile, **overrides))


def test_an_apns_key_that_is_not_p256_names_the_key_not_its_value(tmp_path: Path) -> None:
    keyfile = tmp_path / "wrong.p8"
    key = ec.generate_private_key(ec.SECP384R1())
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    assert "keyfile: must be an ES256 (P-256) private key" in app_error(tmp_path, apns_values(str(keyfile)))
    keyfile.write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n")
    assert "keyfile: not a readable PKCS#8 PEM private key" in app_error(tmp_path, apns_values(str(keyfile)))


GCM_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"api_version": None}, "api_version: must be v1: Google shut the legacy FCM API down"),
    ({"api_version": "legacy"}, "api_version: must be v1: Google shut the legacy FCM API down"),
    ({"project_id": None}, "project_id: required"),
    ({"service_account_file": None}, "service_account_file: required"),
    ({"service_account_file": "/nonexistent.json"}, "service_account_file: not service-account JSON"),
    ({"fcm_options": "high"}, "fcm_options: must be a mapping"),
    ({"max_connections": 0}, "max_connections: must be at least 1"),
    ({"endpoint": "ftp://x"}, "endpoint: must be an https:// URL"),
]


@pytest.mark.parametrize(("overrides", "expected"), GCM_ERRORS, ids=[e for _, e in GCM_ERRORS])
def test_gcm_errors_name_the_app_and_key(
    tmp_path: Path, files: tuple[str, str], overrides: dict[str, Any], expected: str
) -> None:
    _, account = files
    assert expected in app_error(tmp_path, gcm_values(account, **overrides))


def test_a_legacy_gcm_app_with_an_api_key_never_shows_it(tmp_path: Path) -> None:
    message = app_error(tmp_path, {"type": "gcm", "api_key": SECRET})
    assert "Google shut the legacy FCM API down" in message


def test_a_service_account_without_its_fields_names_them(tmp_path: Path) -> None:
    account = tmp_path / "account.json"
    account.write_text(json.dumps({"project_id": "p", "private_key": SECRET}))
    message = app_error(tmp_path, gcm_values(str(account)))
    assert "service_account_file: the service account has no client_email, token_uri" in message


# --------------------------------------------------------------------------- certificate auth


def certificate_file(folder: Path, uid: str | None) -> str:
    """A PEM file holding a client certificate (with Apple's UID naming the topic) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, "Apple Push Services: org.cert")]
    if uid:
        attributes.append(x509.NameAttribute(NameOID.USER_ID, uid))
    name = x509.Name(attributes)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    path = folder / f"cert-{uid}.pem"
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(cert.public_bytes(pem) + key_pem)
    return str(path)


def test_certificate_auth_takes_the_topic_from_the_certificate(tmp_path: Path) -> None:
    certfile = certificate_file(tmp_path, "org.cert")
    config = load(tmp_path, {"apps": {"a": {"type": "apns", "certfile": certfile}}})
    credentials = config.apps.apps[0].credentials
    assert (credentials.cert_file, credentials.bundle_id) == (certfile, "org.cert")
    other = load(tmp_path, {"apps": {"a": {"type": "apns", "certfile": certfile, "topic": "org.other"}}})
    assert other.apps.apps[0].credentials.bundle_id == "org.other"


def test_certificate_without_a_topic_names_the_topic_key(tmp_path: Path) -> None:
    certfile = certificate_file(tmp_path, None)
    message = app_error(tmp_path, {"type": "apns", "certfile": certfile})
    assert message.endswith("apps.org.app.topic: required (the certificate has no UID to take it from)")


async def test_a_certificate_app_sends_with_its_client_certificate_and_no_token(
    tmp_path: Path, tls: TlsFiles
) -> None:
    certfile = certificate_file(tmp_path, "org.cert")
    with FakeApns(tls, client_ca=certfile) as apns:  # only this certificate is let in
        values = {
            "type": "apns",
            "certfile": certfile,
            "endpoint": apns.endpoint,
            "ca_file": apns.tls.ca_file,
        }
        path = write_config(tmp_path, {"org.cert.app": values})
        async with running(gateway_settings(path)) as gateway:
            response = await gateway.notify(event_id_only(device("org.cert.app", "AQID")))
            assert (response.status_code, response.json()) == (200, {"rejected": []})
        [request] = apns.requests
        [subject] = apns.client_subjects
    assert ((("userId", "org.cert"),)) in subject["subject"]
    assert request.header("authorization") is None
    assert (request.header("apns-topic"), request.path) == ("org.cert", "/3/device/010203")


@pytest.mark.slow
async def test_a_token_app_is_refused_where_a_certificate_is_required(tmp_path: Path, tls: TlsFiles) -> None:
    certfile = certificate_file(tmp_path, "org.cert")
    keyfile, _ = write_key_files(tmp_path)
    with FakeApns(tls, client_ca=certfile) as apns:
        values = {**apns_values(keyfile), "endpoint": apns.endpoint, "ca_file": apns.tls.ca_file}
        path = write_config(tmp_path, {"org.token.app": values})
        async with running(gateway_settings(path, matrix_request_timeout_seconds=2)) as gateway:
            response = await gateway.notify(event_id_only(device("org.token.app", "AQID")))
    assert response.status_code == 502  # the TLS handshake fails: our side, not the token's
    assert apns.requests == []


def test_the_gateway_command_refuses_a_bad_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.cli import main

    keyfile, _ = write_key_files(tmp_path)
    monkeypatch.setenv(
        "XMTP_PUSH_MATRIX_APPS", write_config(tmp_path, {"org.app": apns_values(keyfile, topic=None)})
    )
    assert main(["gateway"]) == 2
    assert capsys.readouterr().err.strip() == "xmtp-push: XMTP_PUSH_MATRIX_APPS: apps.org.app.topic: required"


def test_the_gateway_command_needs_matrix_apps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.cli import main

    monkeypatch.delenv("XMTP_PUSH_MATRIX_APPS", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["gateway"])
    assert exited.value.code == 2
    assert "XMTP_PUSH_MATRIX_APPS: required by `gateway`" in capsys.readouterr().err


def test_config_check_reports_the_matrix_apps(tmp_path: Path, files: tuple[str, str]) -> None:
    keyfile, account = files
    good = write_config(tmp_path, {"a": apns_values(keyfile), "b": gcm_values(account)})
    assert matrix_check(good, SETTINGS) == Check("matrix apps", True, "2 app(s): apns, gcm")
    bad = write_config(tmp_path, {"a": apns_values(keyfile, team_id=None)})
    assert matrix_check(bad, SETTINGS) == Check(
        "matrix apps", False, "XMTP_PUSH_MATRIX_APPS: apps.a.team_id: required", INVALID_CONFIGURATION
    )
