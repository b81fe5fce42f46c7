"""The legacy API's settings (docs/configuration.md): each refused with the setting's name, never
its value."""

from __future__ import annotations

import base64

import pytest

from app.core.config import SettingsError, load_settings
from app.core.legacy_settings import signing_key_bytes

SECRET_TEXT = "s3cr3t-value"


@pytest.mark.parametrize(
    ("variable", "value", "told"),
    [
        ("XMTP_PUSH_LEGACY_HTTP_DELIVERY_SIGNING_KEY", "whsec_" + SECRET_TEXT, "Standard Webhooks key"),
        (
            "XMTP_PUSH_LEGACY_HTTP_DELIVERY_SIGNING_KEY",
            base64.b64encode(b"k" * 16).decode(),
            "24 to 64 bytes",
        ),
        ("XMTP_PUSH_LEGACY_HTTP_DELIVERY_URL", f"ftp://{SECRET_TEXT}.example/hook", "http:// or https://"),
        ("XMTP_PUSH_LEGACY_INSTALLATION_TTL_SECONDS", "59", "greater than or equal to 60"),
        ("XMTP_PUSH_LEGACY_ALERT_TEXT", "x" * 257, "at most 256"),
        ("XMTP_PUSH_NODE_GO_ADDRESS", f"{SECRET_TEXT}.example", "host:port"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, told: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert f"{variable}: " in str(refused.value) and told in str(refused.value)
    assert SECRET_TEXT not in str(refused.value)


def test_a_signing_key_is_read_with_or_without_its_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = bytes(range(32))
    text = base64.b64encode(raw).decode()
    assert signing_key_bytes("whsec_" + text) == signing_key_bytes(text) == raw
    monkeypatch.setenv("XMTP_PUSH_LEGACY_HTTP_DELIVERY_SIGNING_KEY", "whsec_" + text)
    monkeypatch.setenv("XMTP_PUSH_NODE_GO_ADDRESS", "node.example:5556")
    settings = load_settings()
    assert settings.legacy_http_delivery_signing_key is not None
    assert settings.node_go_address == "node.example:5556"
