"""Real credentials for the fakes, made once per process: an ES256 APNs key and an FCM service account."""

from __future__ import annotations

import functools
import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

PKCS8 = serialization.PrivateFormat.PKCS8
PEM = serialization.Encoding.PEM


@functools.cache
def apns_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def apns_key_pem() -> str:
    return apns_key().private_bytes(PEM, PKCS8, serialization.NoEncryption()).decode()


@functools.cache
def fcm_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def service_account(token_uri: str = "http://127.0.0.1:9/token", project_id: str = "test-project") -> str:
    """Service-account JSON whose OAuth token endpoint is `token_uri` (a local fake in FCM tests)."""
    pem = fcm_key().private_bytes(PEM, PKCS8, serialization.NoEncryption()).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": project_id,
            "private_key_id": "test-key-id",
            "private_key": pem,
            "client_email": f"push@{project_id}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": token_uri,
        }
    )
