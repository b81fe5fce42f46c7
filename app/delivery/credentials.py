"""Channel credentials, loaded and checked at start-up so a bad one stops the process early.

`load_apns`, `load_fcm` and `load_webpush` take an app's values as written (text or a path) and the names its
configuration gives them, so the flat XMTP_PUSH_* settings (the default app) and a file of
several apps load the same way. Errors name the setting and never include the credential.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import NameOID
from py_vapid import Vapid, VapidException

from app.core.config import APNS_REQUIRED, ENV_PREFIX, FCM_REQUIRED, Settings, SettingsError

APPLE_HOSTS = {"production": "https://api.push.apple.com", "sandbox": "https://api.sandbox.push.apple.com"}
FCM_ENDPOINT = "https://fcm.googleapis.com"
WEBPUSH_DEFAULT_TTL = 15 * 60  # seconds a push service keeps a push for a device that is offline
WEBPUSH_MAX_TTL = 28 * 24 * 3600  # the longest push services keep one
WEBPUSH_DEFAULT_MAX_CONNECTIONS = 20


@dataclass(frozen=True, slots=True)
class ApnsCredentials:
    key_pem: str
    key_id: str
    team_id: str
    bundle_id: str
    endpoint: str
    ca_file: str | None
    # Certificate auth: a PEM file holding the client certificate and its key (no provider token).
    cert_file: str | None = None


@dataclass(frozen=True, slots=True)
class FcmCredentials:
    service_account: dict[str, Any]
    project_id: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class WebPushCredentials:
    vapid: Vapid  # the application server's key (RFC 8292), py_vapid's signer
    contact: str  # the VAPID `sub` claim: a mailto: or https: URI
    ttl_seconds: int
    allowed_endpoints: tuple[str, ...]  # globs over an endpoint's host[:port]; empty: any
    max_connections: int


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


def load_apns_certificate(
    cert_file: str,
    apns_topic: str | None,
    *,
    environment: str = "production",
    endpoint: str | None = None,
    ca_file: str | None = None,
    names: Mapping[str, str],
) -> ApnsCredentials:
    """An APNs certificate-auth app; its apns-topic defaults to the certificate's UID, as Apple
    issues them. `names` maps "cert_file", "apns_topic" and "ca_file" to how the operator wrote them."""
    try:
        ssl.create_default_context().load_cert_chain(cert_file)
        certificate = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except (OSError, ValueError, ssl.SSLError):
        raise SettingsError(
            f"{names['cert_file']}: not a readable PEM certificate with its private key"
        ) from None
    if not apns_topic:
        uids = certificate.subject.get_attributes_for_oid(NameOID.USER_ID)
        apns_topic = str(uids[0].value) if uids else None
    if not apns_topic:
        raise SettingsError(f"{names['apns_topic']}: required (the certificate has no UID to take it from)")
    if ca_file and not Path(ca_file).is_file():
        raise SettingsError(f"{names['ca_file']}: file not found")
    return ApnsCredentials("", "", "", apns_topic, endpoint or APPLE_HOSTS[environment], ca_file, cert_file)


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


def load_webpush(
    vapid_private_key: str,
    vapid_contact_email: str,
    *,
    ttl: object = WEBPUSH_DEFAULT_TTL,
    allowed_endpoints: object = (),
    max_connections: object = WEBPUSH_DEFAULT_MAX_CONNECTIONS,
    names: Mapping[str, str],
) -> WebPushCredentials:
    """A Web Push app; `names` maps each argument's name to how the operator wrote it."""
    vapid = _load_vapid_key(vapid_private_key, names["vapid_private_key"])
    contact = _vapid_contact(vapid, vapid_contact_email, names["vapid_contact_email"])
    if not _is_int(ttl) or not 0 <= ttl <= WEBPUSH_MAX_TTL:
        raise SettingsError(f"{names['ttl']}: must be a whole number of seconds from 0 to {WEBPUSH_MAX_TTL}")
    if not _is_int(max_connections) or max_connections < 1:
        raise SettingsError(f"{names['max_connections']}: must be a whole number of at least 1")
    if isinstance(allowed_endpoints, str) or not isinstance(allowed_endpoints, list | tuple):
        raise SettingsError(f"{names['allowed_endpoints']}: must be a list of host globs")
    if not all(isinstance(glob, str) and glob for glob in allowed_endpoints):
        raise SettingsError(f"{names['allowed_endpoints']}: every entry must be a non-empty host glob")
    return WebPushCredentials(vapid, contact, ttl, tuple(allowed_endpoints), max_connections)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _load_vapid_key(value: str, name: str) -> Vapid:
    """A P-256 key as PEM, or as base64url DER or raw 32 bytes (what `vapid --gen` and web-push
    tools print); text or a path. py_vapid's own file loader is not used: it makes a new key
    when the file is missing."""
    error = SettingsError(f"{name}: not a readable P-256 private key (PEM or base64url; text or path)")
    text = value if isinstance(value, str) else ""
    if text and not text.lstrip().startswith("-----BEGIN") and Path(text).is_file():
        try:
            text = Path(text).read_text()
        except (OSError, UnicodeDecodeError):
            raise error from None
    try:
        text = text.strip()
        vapid = Vapid.from_pem(text.encode()) if text.startswith("-----BEGIN") else Vapid.from_string(text)
    except (ValueError, TypeError, VapidException):
        raise error from None
    key = vapid.private_key
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise error
    return vapid


def _vapid_contact(vapid: Vapid, email: str, name: str) -> str:
    """The `sub` claim: an address gets mailto: (as operators write it); a mailto: or https: URI is
    kept. Checked by signing once, so a claim py_vapid refuses stops start-up, not a push."""
    if not isinstance(email, str) or not email.strip():
        raise SettingsError(f"{name}: required (the contact address push services see)")
    email = email.strip()
    contact = email if email.startswith(("mailto:", "https:")) else f"mailto:{email}"
    try:
        vapid.sign({"sub": contact, "aud": "https://push.example.org", "exp": 1})
    except VapidException:
        raise SettingsError(f"{name}: not an e-mail address, mailto: or https: URI") from None
    return contact


def apns_credentials(settings: Settings) -> ApnsCredentials | None:
    """The default app's APNs credentials, from the flat XMTP_PUSH_APNS_* settings."""
    if not settings.all_set(APNS_REQUIRED):
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
    if not settings.all_set(FCM_REQUIRED):
        return None
    assert settings.fcm_service_account
    return load_fcm(
        settings.fcm_service_account,
        endpoint=settings.fcm_endpoint,
        name=f"{ENV_PREFIX}FCM_SERVICE_ACCOUNT",
    )
