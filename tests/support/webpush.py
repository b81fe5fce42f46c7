"""The Web Push channel's test builders: an app's VAPID credentials from a key, and the payload a test
pushes."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.delivery.credentials import WebPushCredentials, load_webpush

NAMES = {
    key: f"apps.web.{key}"
    for key in ("vapid_private_key", "vapid_contact_email", "ttl", "allowed_endpoints", "max_connections")
}
PAYLOAD = b'{"event_id":"$e","room_id":"!r:example.org","unread":2}'


def pem(key: ec.EllipticCurvePrivateKey) -> str:
    encoding, private = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, private, serialization.NoEncryption()).decode()


def credentials(key: ec.EllipticCurvePrivateKey, **values: object) -> WebPushCredentials:
    return load_webpush(pem(key), "ops@example.org", names=NAMES, **values)  # type: ignore[arg-type]
