"""docs/switching.md holds each setting of the Go reference server beside its counterpart here, and names
only settings that exist; the README's first screen says which SDKs call which API and points there."""

from __future__ import annotations

import re
from pathlib import Path

from app.core.config import ENV_PREFIX, Settings
from tests.support.readme import section, table

ROOT = Path(__file__).resolve().parents[1]
SWITCHING = ROOT / "docs" / "switching.md"
README = ROOT / "README.md"
SETTINGS_HEADING = "## The settings, one by one"
# The Go server's settings (environment variables and flags) an operator sets, and the setting here each
# maps to (docs/switching.md#the-settings-one-by-one); None: no counterpart, said in the row.
GO_SETTINGS: dict[str, tuple[str, ...]] = {
    "API_PORT": ("XMTP_PUSH_HTTP_PORT", "XMTP_PUSH_GRPC_PORT"),
    "XMTP_GRPC_ADDRESS": ("XMTP_PUSH_NODE_GO_ADDRESS",),
    "--xmtp-listener-tls": ("XMTP_PUSH_NODE_GO_TLS",),
    "APNS_P8_CERTIFICATE": ("XMTP_PUSH_APNS_KEY",),
    "APNS_P8_CERTIFICATE_FILE_PATH": ("XMTP_PUSH_APNS_KEY",),
    "APNS_KEY_ID": ("XMTP_PUSH_APNS_KEY_ID",),
    "APNS_TEAM_ID": ("XMTP_PUSH_APNS_TEAM_ID",),
    "APNS_TOPIC": ("XMTP_PUSH_APNS_BUNDLE_ID",),
    "APNS_MODE": ("XMTP_PUSH_APNS_ENVIRONMENT",),
    "FCM_CREDENTIALS_JSON": ("XMTP_PUSH_FCM_SERVICE_ACCOUNT",),
    "FCM_PROJECT_ID": (),
    "--http-delivery-address": ("XMTP_PUSH_LEGACY_HTTP_DELIVERY_URL",),
    "--http-auth-header": ("XMTP_PUSH_LEGACY_HTTP_DELIVERY_AUTHORIZATION",),
    "DB_CONNECTION_STRING": ("XMTP_PUSH_DATABASE_URL",),
    "LOG_LEVEL": ("XMTP_PUSH_LOG_LEVEL",),
}
SETTING = re.compile(rf"\b{ENV_PREFIX}[A-Z0-9_]+\b")
# Read by app.core.config.load_settings beside the settings: the file that holds them.
NOT_A_FIELD = {f"{ENV_PREFIX}CONFIG"}


def rows() -> dict[str, list[str]]:
    """The settings table's rows by the Go server's name (its first code span)."""
    found = {}
    for row in table(section(SWITCHING.read_text(encoding="utf-8"), SETTINGS_HEADING), "Go server"):
        name = re.match(r"`([^`]+)`", row[0])
        assert name, f"a row of docs/switching.md names no Go setting: {row}"
        found[name.group(1)] = row
    return found


def test_every_go_setting_has_its_row_and_counterpart() -> None:
    table_rows = rows()
    missing = sorted(set(GO_SETTINGS) - set(table_rows))
    assert not missing, f"docs/switching.md's settings table lacks {missing}"
    for name, counterparts in GO_SETTINGS.items():
        named = SETTING.findall(table_rows[name][1])
        assert named == list(counterparts) if counterparts else table_rows[name][1] == "none", (name, named)


def test_the_defaults_that_differ_are_said() -> None:
    apns_mode = rows()["APNS_MODE"]
    assert "(default `development`)" in apns_mode[0] and "(default `production`)" in apns_mode[1]
    assert "`XMTP_PUSH_APNS_ENVIRONMENT=sandbox`" in apns_mode[2]
    assert "(on by default)" in rows()["--xmtp-listener-tls"][1]
    assert Settings.model_fields["apns_environment"].default == "production"
    assert Settings.model_fields["node_go_tls"].default is True


def test_every_setting_named_exists() -> None:
    named = set(SETTING.findall(SWITCHING.read_text(encoding="utf-8"))) - NOT_A_FIELD
    unknown = sorted(n for n in named if n.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields)
    assert len(named) >= 20 and not unknown, f"docs/switching.md names no such setting: {unknown}"


def test_the_readme_first_screen_says_which_sdks_call_which_api() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = text[: text.index("make install run")]
    statement = first_screen[first_screen.index("**Which XMTP SDKs call which API.**") :]
    for needed in (
        "`XMTPPush`",
        "React Native SDK 5.x, iOS and Android SDKs 4.x",
        "`notifications.v1`",
        "`XMTP_PUSH_LEGACY_API_ENABLED=true`",
        "(docs/switching.md)",
        "`xmtp.backend.v1.NotificationService`",
        "`enableNotifications`",
    ):
        assert needed in statement, needed
    assert "(switching.md)" in (ROOT / "docs" / "legacy.md").read_text(encoding="utf-8")
