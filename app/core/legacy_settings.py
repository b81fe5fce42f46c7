"""The legacy notifications.v1 API's settings, a part of the one Settings object (app.core.config)."""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings

DEFAULT_ALERT_TEXT = "New message from XMTP"
MIN_SIGNING_KEY_BYTES, MAX_SIGNING_KEY_BYTES = 24, 64
BAD_SIGNING_KEY = (
    f"must be a Standard Webhooks key (whsec_ and base64, or base64) of {MIN_SIGNING_KEY_BYTES} to "
    f"{MAX_SIGNING_KEY_BYTES} bytes"
)


def signing_key_bytes(text: str) -> bytes:
    """A Standard Webhooks key as its raw bytes; ValueError (never quoting it) when it is not one."""
    try:
        raw = base64.b64decode(text.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(BAD_SIGNING_KEY) from None
    if not MIN_SIGNING_KEY_BYTES <= len(raw) <= MAX_SIGNING_KEY_BYTES:
        raise ValueError(BAD_SIGNING_KEY)
    return raw


class LegacySettings(BaseSettings):
    # Serves notifications.v1.Notifications (dev, api) and pushes to its subscriptions (workers).
    legacy_api_enabled: bool = False
    # An xmtp-node-go node whose MessageApi/SubscribeAll `listen` (and `dev`) reads: host:port.
    node_go_address: str | None = None
    node_go_tls: bool = True
    # An installation's lifetime after each RegisterInstallation (apps register again at start).
    legacy_installation_ttl_seconds: int = Field(2_592_000, ge=60)
    # The APNs alert and the FCM web notification's title of a legacy push.
    legacy_alert_text: str = Field(DEFAULT_ALERT_TEXT, min_length=1, max_length=256)
    # The operator's own receiver (loopback and private hosts allowed): the channel of custom tokens,
    # and of the others when APNs or FCM is not configured.
    legacy_http_delivery_url: str | None = None
    # Sent verbatim as each HTTP delivery's Authorization; never logged.
    legacy_http_delivery_authorization: SecretStr | None = None
    # A Standard Webhooks key signing each HTTP delivery; never logged.
    legacy_http_delivery_signing_key: SecretStr | None = None

    @field_validator("legacy_http_delivery_url")
    @classmethod
    def _check_delivery_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            parsed = urlsplit(value)
            parsed.port  # noqa: B018 - reading it validates it
        except ValueError:
            raise ValueError("not a well-formed URL") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname or any(c.isspace() for c in value):
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("node_go_address")
    @classmethod
    def _check_node_go_address(cls, value: str | None) -> str | None:
        if not value:
            return None
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in value:
            raise ValueError("must be host:port")
        return value

    @field_validator("legacy_http_delivery_authorization", "legacy_http_delivery_signing_key")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, SecretStr) and not value.get_secret_value():
            return None
        if isinstance(value, SecretStr) and info.field_name == "legacy_http_delivery_signing_key":
            signing_key_bytes(value.get_secret_value())
        return value
