"""Marmot EncryptedTokens: the HKDF known answer of docs/marmot.md, our fixed-randomness vectors
(tests/vectors/marmot_tokens.json) both ways, each refused chunk, and an independent derivation.

Contract: docs/marmot.md#token-decryption.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from coincurve import PrivateKey, PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from app.marmot import secp
from app.marmot.tokens import (
    ENCRYPTED_TOKEN_SIZE,
    MAX_TOKEN_SIZE,
    DeviceToken,
    Platform,
    TokenError,
    decrypt_token,
    encrypt_token,
    token_key,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "vectors" / "marmot_tokens.json").read_text()
)
SERVER_SECRET = bytes.fromhex(VECTORS["server_secret"])
SERVER_X = bytes.fromhex(VECTORS["server_public_x"])


def test_the_token_key_known_answer() -> None:
    assert token_key(bytes(range(32))).hex() == (
        "954b9d7be996c0e74517fe49e41e1278f44395d2855a52f50b5e322976dd168d"
    )


def test_the_vectors_cover_both_platforms_and_the_extremes() -> None:
    assert secp.xonly_public_key(SERVER_SECRET) == SERVER_X
    assert {case["platform"] for case in VECTORS["valid"]} == {1, 2}
    lengths = {len(bytes.fromhex(case["token_bytes"])) for case in VECTORS["valid"]}
    assert {1, MAX_TOKEN_SIZE} <= lengths
    assert len(VECTORS["invalid"]) >= 10


@pytest.mark.parametrize("case", VECTORS["valid"], ids=[c["name"] for c in VECTORS["valid"]])
def test_a_vector_encrypts_to_its_bytes_and_decrypts_to_its_token(case: dict[str, Any]) -> None:
    platform = Platform(case["platform"])
    encrypted = encrypt_token(
        SERVER_X,
        platform,
        bytes.fromhex(case["token_bytes"]),
        ephemeral_secret=bytes.fromhex(case["ephemeral_secret"]),
        nonce=bytes.fromhex(case["nonce"]),
        padding=bytes.fromhex(case["padding"]),
    )
    assert encrypted.hex() == case["encrypted_token"]
    assert len(encrypted) == ENCRYPTED_TOKEN_SIZE
    assert decrypt_token(SERVER_SECRET, encrypted) == DeviceToken(platform, case["token"])
    # The rendered form goes in as well as the raw bytes.
    again = encrypt_token(
        SERVER_X,
        platform,
        case["token"],
        ephemeral_secret=bytes.fromhex(case["ephemeral_secret"]),
        nonce=bytes.fromhex(case["nonce"]),
        padding=bytes.fromhex(case["padding"]),
    )
    assert again == encrypted


def _hkdf_sha256(salt: bytes, ikm: bytes, info: bytes) -> bytes:
    prk = hmac.new(salt, ikm, "sha256").digest()
    return hmac.new(prk, info + b"\x01", "sha256").digest()


@pytest.mark.parametrize("case", VECTORS["valid"], ids=[c["name"] for c in VECTORS["valid"]])
def test_a_vector_holds_by_an_independent_derivation(case: dict[str, Any]) -> None:
    """The same bytes from the formulas of docs/marmot.md written out another way: point multiplication
    instead of ECDH, HKDF from the standard library's HMAC, the server's side instead of the app's."""
    encrypted = bytes.fromhex(case["encrypted_token"])
    ephemeral_x, nonce, ciphertext = encrypted[:32], encrypted[32:44], encrypted[44:]
    ephemeral = PrivateKey(bytes.fromhex(case["ephemeral_secret"]))
    assert ephemeral.public_key.format()[1:] == ephemeral_x
    shared = PublicKey(b"\x02" + ephemeral_x).multiply(SERVER_SECRET).format()[1:]
    assert shared.hex() == case["shared_x"]
    key = _hkdf_sha256(b"marmot-push-token-v1", shared, b"marmot-push-token-encryption")
    assert key.hex() == case["key"]
    plaintext = ChaCha20Poly1305(key).decrypt(nonce, ciphertext, b"")
    raw = bytes.fromhex(case["token_bytes"])
    assert plaintext == bytes([case["platform"]]) + len(raw).to_bytes(2, "big") + raw + bytes.fromhex(
        case["padding"]
    )
    expected = raw.hex() if case["platform"] == 1 else raw.decode()
    assert case["token"] == expected


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=[c["name"] for c in VECTORS["invalid"]])
def test_an_invalid_vector_is_refused_for_its_reason(case: dict[str, str]) -> None:
    chunk = bytes.fromhex(case["encrypted_token"])
    assert len(chunk) == ENCRYPTED_TOKEN_SIZE
    with pytest.raises(TokenError) as refused:
        decrypt_token(SERVER_SECRET, chunk)
    assert str(refused.value) == case["reason"]
    assert refused.value.__cause__ is None


@pytest.mark.parametrize(
    "size", [0, 1, ENCRYPTED_TOKEN_SIZE - 1, ENCRYPTED_TOKEN_SIZE + 1, 2 * ENCRYPTED_TOKEN_SIZE]
)
def test_a_chunk_of_another_size_is_refused(size: int) -> None:
    with pytest.raises(TokenError, match="size"):
        decrypt_token(SERVER_SECRET, bytes(size))


def test_another_servers_key_cannot_read_a_token() -> None:
    encrypted = bytes.fromhex(VECTORS["valid"][0]["encrypted_token"])
    other = bytes(31) + b"\x07"
    with pytest.raises(TokenError, match="authentication failed"):
        decrypt_token(other, encrypted)


@pytest.mark.parametrize(
    ("platform", "token"),
    [
        (Platform.APNS, "00ff" * 16),
        (Platform.APNS, "ab" * 100),
        (Platform.FCM, "cXyz:APA91b" + "Q" * 140),
        (Platform.FCM, "ü" * 510 + "!"),
    ],
)
def test_tokens_round_trip_with_fresh_randomness(platform: Platform, token: str) -> None:
    first = encrypt_token(SERVER_X, platform, token)
    second = encrypt_token(SERVER_X, platform, token)
    assert first != second
    assert first[:32] != second[:32] and first[32:44] != second[32:44]
    for encrypted in (first, second):
        assert decrypt_token(SERVER_SECRET, encrypted) == DeviceToken(platform, token)


def test_uppercase_apns_hex_comes_back_lowercase() -> None:
    encrypted = encrypt_token(SERVER_X, Platform.APNS, "ABCDEF01" * 8)
    assert decrypt_token(SERVER_SECRET, encrypted).token == "abcdef01" * 8


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"token": b""}, "invalid token length"),
        ({"token": b"x" * (MAX_TOKEN_SIZE + 1)}, "invalid token length"),
        ({"token": "not hex"}, "APNs token is not hex"),
        ({"padding": bytes(10)}, "padding does not fill"),
        ({"nonce": bytes(11)}, "nonce is not 12 bytes"),
        ({"ephemeral_secret": bytes(32)}, "invalid server key or ephemeral secret"),
        ({"server_public_x": b"\xff" * 32}, "invalid server key or ephemeral secret"),
    ],
)
def test_encrypting_refuses_bad_arguments(arguments: dict[str, Any], reason: str) -> None:
    values: dict[str, Any] = {"server_public_x": SERVER_X, "platform": Platform.APNS, "token": b"\x01" * 32}
    values.update(arguments)
    with pytest.raises(TokenError, match=reason):
        encrypt_token(values.pop("server_public_x"), values.pop("platform"), values.pop("token"), **values)


def test_a_device_tokens_repr_hides_the_token() -> None:
    token = DeviceToken(Platform.FCM, "secret-registration-token")
    assert "secret-registration-token" not in repr(token)
    assert "secret-registration-token" not in f"{[token]}"
    assert repr(token) == "DeviceToken(platform=FCM)"


def test_an_invalid_point_or_scalar_yields_no_key_material() -> None:
    for bad_point in (
        bytes(32),
        b"\xff" * 32,
        bytes.fromhex("eb1f7200aecaa86682376fb1c13cd12b732221e774f553b0a0857f88fa20f86d"),
    ):
        with pytest.raises(secp.CurveError):
            secp.shared_x(SERVER_SECRET, bad_point)
    for bad_scalar in (bytes(32), b"\xff" * 32, SERVER_SECRET[:31]):
        with pytest.raises(secp.CurveError):
            secp.shared_x(bad_scalar, SERVER_X)
