"""Channel credentials, loaded and checked at start-up so a bad one stops the process early.

`load_apns` and `load_fcm` take an app's values as written (text or a path) and the names its
configuration gives them, so the flat XMTP_PUSH_* settings (the default app) and a file of
several apps load the same way. Errors name the setting and never include the credential.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from app.core.config import ENV_PREFIX, Settings, SettingsError

APPLE_HOSTS = {"production": "https://api.push.apple.com", "sandbox": "https://api.sandbox.push.apple.com"}
FCM_ENDPOINT = "https://fcm.googleapis.com"


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


def load_apns(
    key: str,
    key_id: str,
    team_id: str,
    bundle_id: str,
    *,
    environment: str = "production",
    endpoint: str | None = None,
    ca_file: str | None = None,
    names: Mapping[str, str],
) -> ApnsCredentials:
    """An APNs token-auth app; `names` maps "key" and "ca_file" to how the operator wrote them."""
    try:
        pem = _text_or_file(key, "-----BEGIN")
        private_key = load_pem_private_key(pem.encode(), password=None)
    except (OSError, ValueError, TypeError):
        raise SettingsError(f"{names['key']}: not a readable PKCS#8 PEM private key (text or path)") from None
    if not isinstance(private_key, ec.EllipticCurvePrivateKey) or private_key.curve.name != "secp256r1":
        raise SettingsError(f"{names['key']}: must be an ES256 (P-256) private key")
    if ca_file and not Path(ca_file).is_file():
        raise SettingsError(f"{names['ca_file']}: file not found")
    return ApnsCredentials(pem, key_id, team_id, bundle_id, endpoint or APPLE_HOSTS[environment], ca_file)


def load_fcm(service_account: str, *, endpoint: str = FCM_ENDPOINT, name: str) -> FcmCredentials:
    """An FCM app from its service-account JSON (text or path), named `name` in errors."""
    try:
        account = json.loads(_text_or_file(service_account, "{"))
    except (OSError, ValueError):
        raise SettingsError(f"{name}: not service-account JSON (text or path)") from None
    if not isinstance(account, dict) or not account.get("project_id"):
        raise SettingsError(f"{name}: the service account has no project_id")
    missing = [field for field in ("client_email", "private_key", "token_uri") if not account.get(field)]
    if missing:
        raise SettingsError(f"{name}: the service account has no {', '.join(missing)}")
    return FcmCredentials(account, str(account["project_id"]), endpoint.rstrip("/"))


def apns_credentials(settings: Settings) -> ApnsCredentials | None:
    """The default app's APNs credentials, from the flat XMTP_PUSH_APNS_* settings."""
    if not settings.apns_configured:
        return None
    assert settings.apns_key and settings.apns_key_id and settings.apns_team_id and settings.apns_bundle_id
    return load_apns(
        settings.apns_key,
        settings.apns_key_id,
        settings.apns_team_id,
        settings.apns_bundle_id,
        environment=settings.apns_environment,
        endpoint=settings.apns_endpoint,
        ca_file=settings.apns_ca_file,
        names={"key": f"{ENV_PREFIX}APNS_KEY", "ca_file": f"{ENV_PREFIX}APNS_CA_FILE"},
    )


def fcm_credentials(settings: Settings) -> FcmCredentials | None:
    """The default app's FCM credentials, from the flat XMTP_PUSH_FCM_* settings."""
    if not settings.fcm_service_account:
        return None
    return load_fcm(
        settings.fcm_service_account,
        endpoint=settings.fcm_endpoint,
        name=f"{ENV_PREFIX}FCM_SERVICE_ACCOUNT",
    )
