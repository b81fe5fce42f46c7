"""Channel credentials from settings, checked at start-up so a bad one stops the process early.

Errors name the setting and never include the credential itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from app.core.config import Settings, SettingsError

APPLE_HOSTS = {"production": "https://api.push.apple.com", "sandbox": "https://api.sandbox.push.apple.com"}


@dataclass(frozen=True, slots=True)
class ApnsCredentials:
    key_pem: str
    key_id: str
    team_id: str
    bundle_id: str
    endpoint: str
    ca_file: str | None


@dataclass(frozen=True, slots=True)
class FcmCredentials:
    service_account: dict[str, Any]
    project_id: str
    endpoint: str


def _text_or_file(value: str, marker: str) -> str:
    if value.lstrip().startswith(marker):
        return value
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError
    return path.read_text()


def apns_credentials(settings: Settings) -> ApnsCredentials | None:
    if not settings.apns_configured:
        return None
    assert settings.apns_key and settings.apns_key_id and settings.apns_team_id and settings.apns_bundle_id
    try:
        pem = _text_or_file(settings.apns_key, "-----BEGIN")
        key = load_pem_private_key(pem.encode(), password=None)
    except (OSError, ValueError, TypeError):
        raise SettingsError(
            "XMTP_PUSH_APNS_KEY: not a readable PKCS#8 PEM private key (text or path)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise SettingsError("XMTP_PUSH_APNS_KEY: must be an ES256 (P-256) private key")
    if settings.apns_ca_file and not Path(settings.apns_ca_file).is_file():
        raise SettingsError("XMTP_PUSH_APNS_CA_FILE: file not found")
    endpoint = settings.apns_endpoint or APPLE_HOSTS[settings.apns_environment]
    return ApnsCredentials(
        pem,
        settings.apns_key_id,
        settings.apns_team_id,
        settings.apns_bundle_id,
        endpoint,
        settings.apns_ca_file,
    )


def fcm_credentials(settings: Settings) -> FcmCredentials | None:
    if not settings.fcm_service_account:
        return None
    try:
        account = json.loads(_text_or_file(settings.fcm_service_account, "{"))
    except (OSError, ValueError):
        raise SettingsError(
            "XMTP_PUSH_FCM_SERVICE_ACCOUNT: not service-account JSON (text or path)"
        ) from None
    if not isinstance(account, dict) or not account.get("project_id"):
        raise SettingsError("XMTP_PUSH_FCM_SERVICE_ACCOUNT: the service account has no project_id")
    missing = [name for name in ("client_email", "private_key", "token_uri") if not account.get(name)]
    if missing:
        raise SettingsError(f"XMTP_PUSH_FCM_SERVICE_ACCOUNT: the service account has no {', '.join(missing)}")
    return FcmCredentials(account, str(account["project_id"]), settings.fcm_endpoint.rstrip("/"))


def check_credentials(settings: Settings) -> None:
    """Raise SettingsError when a configured channel's credential is unusable."""
    apns_credentials(settings)
    fcm_credentials(settings)
