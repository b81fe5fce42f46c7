"""Marmot encrypted device tokens (marmot-push-v1 "Token encryption").

EncryptedToken = ephemeral x-only pubkey[32] || nonce[12] || ChaCha20-Poly1305 ciphertext[1040]
(1024 bytes of plaintext and the 16-byte tag, empty AAD). The key is HKDF-SHA256 over the raw X of
ECDH(server secret, ephemeral key lifted to even Y). The plaintext is
platform[1] || token length[2, big-endian] || token || random padding, 1024 bytes in all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import IntEnum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.marmot import secp

SALT = b"marmot-push-token-v1"
INFO = b"marmot-push-token-encryption"
NONCE_SIZE = 12
TAG_SIZE = 16
PLAINTEXT_SIZE = 1024
CIPHERTEXT_SIZE = PLAINTEXT_SIZE + TAG_SIZE
ENCRYPTED_TOKEN_SIZE = secp.KEY_SIZE + NONCE_SIZE + CIPHERTEXT_SIZE  # 1084
_HEADER_SIZE = 3  # platform and token length
MAX_TOKEN_SIZE = PLAINTEXT_SIZE - _HEADER_SIZE  # 1021


class Platform(IntEnum):
    APNS = 0x01
    FCM = 0x02


class TokenError(ValueError):
    """A chunk that is not an EncryptedToken for this server (padding looks like this too). The
    message is a fixed phrase: it never carries the chunk or a token."""


@dataclass(frozen=True, slots=True)
class DeviceToken:
    """A decrypted token: APNs as lowercase hex (the request path's form), FCM as its text."""

    platform: Platform
    token: str

    def __repr__(self) -> str:  # the token itself is never printed
        return f"DeviceToken(platform={self.platform.name})"


def token_key(shared_x: bytes) -> bytes:
    """HKDF-SHA256(salt "marmot-push-token-v1", IKM shared_x, info "marmot-push-token-encryption")."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=SALT, info=INFO).derive(shared_x)


def decrypt_token(server_secret: bytes, chunk: bytes) -> DeviceToken:
    """The device token in one 1084-byte chunk; TokenError for a chunk of another size, an invalid
    ephemeral key, a failed ECDH, a failed tag, or a plaintext that is not a token."""
    if len(chunk) != ENCRYPTED_TOKEN_SIZE:
        raise TokenError("not an EncryptedToken's size")
    ephemeral_x, nonce = chunk[: secp.KEY_SIZE], chunk[secp.KEY_SIZE : secp.KEY_SIZE + NONCE_SIZE]
    try:
        shared = secp.shared_x(server_secret, ephemeral_x)
    except secp.CurveError:
        raise TokenError("invalid ephemeral key or failed ECDH") from None
    try:
        plaintext = ChaCha20Poly1305(token_key(shared)).decrypt(
            nonce, chunk[secp.KEY_SIZE + NONCE_SIZE :], None
        )
    except InvalidTag:
        raise TokenError("authentication failed") from None
    return parse_plaintext(plaintext)


def parse_plaintext(plaintext: bytes) -> DeviceToken:
    if len(plaintext) != PLAINTEXT_SIZE:
        raise TokenError("plaintext is not 1024 bytes")
    if plaintext[0] not in (Platform.APNS, Platform.FCM):
        raise TokenError("unknown platform")
    length = int.from_bytes(plaintext[1:3], "big")
    if not 1 <= length <= MAX_TOKEN_SIZE:
        raise TokenError("invalid token length")
    raw = plaintext[_HEADER_SIZE : _HEADER_SIZE + length]
    if plaintext[0] == Platform.APNS:
        return DeviceToken(Platform.APNS, raw.hex())
    try:
        return DeviceToken(Platform.FCM, raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TokenError("FCM token is not UTF-8") from None


def token_bytes(platform: Platform, token: str | bytes) -> bytes:
    """The raw bytes a token is carried as: APNs hex decoded, FCM text as UTF-8; bytes as they are."""
    if isinstance(token, bytes):
        return token
    if platform is not Platform.APNS:
        return token.encode("utf-8")
    try:
        return bytes.fromhex(token)
    except ValueError:
        raise TokenError("APNs token is not hex") from None


def token_plaintext(platform: Platform, token: str | bytes, padding: bytes | None = None) -> bytes:
    """platform || length || token || padding (random unless given; it must fill 1024 bytes)."""
    raw = token_bytes(platform, token)
    if not 1 <= len(raw) <= MAX_TOKEN_SIZE:
        raise TokenError("invalid token length")
    filler = PLAINTEXT_SIZE - _HEADER_SIZE - len(raw)
    padding = os.urandom(filler) if padding is None else padding
    if len(padding) != filler:
        raise TokenError("padding does not fill the plaintext to 1024 bytes")
    return bytes([platform]) + len(raw).to_bytes(2, "big") + raw + padding


def seal_plaintext(
    server_public_x: bytes,
    plaintext: bytes,
    *,
    ephemeral_secret: bytes | None = None,
    nonce: bytes | None = None,
) -> bytes:
    """An EncryptedToken around any 1024-byte plaintext (tools and tests build bad ones with it)."""
    if len(plaintext) != PLAINTEXT_SIZE:
        raise TokenError("plaintext is not 1024 bytes")
    ephemeral_secret = secp.fresh_secret() if ephemeral_secret is None else ephemeral_secret
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    if len(nonce) != NONCE_SIZE:
        raise TokenError("nonce is not 12 bytes")
    try:
        shared = secp.shared_x(ephemeral_secret, server_public_x)
        ephemeral_x = secp.xonly_public_key(ephemeral_secret)
    except secp.CurveError:
        raise TokenError("invalid server key or ephemeral secret") from None
    return ephemeral_x + nonce + ChaCha20Poly1305(token_key(shared)).encrypt(nonce, plaintext, None)


def encrypt_token(
    server_public_x: bytes,
    platform: Platform,
    token: str | bytes,
    *,
    ephemeral_secret: bytes | None = None,
    nonce: bytes | None = None,
    padding: bytes | None = None,
) -> bytes:
    """A device's EncryptedToken for the server `server_public_x` (what an app does; here for tools
    and tests). Fresh randomness for whatever is not given."""
    plaintext = token_plaintext(platform, token, padding)
    return seal_plaintext(server_public_x, plaintext, ephemeral_secret=ephemeral_secret, nonce=nonce)
