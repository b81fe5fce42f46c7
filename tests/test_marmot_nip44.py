"""NIP-44 v2 against the official vectors, every group, the invalid ones included, and the extended
length prefix that accepts what the file calls too long.

Contract: docs/marmot.md#nip-44-v2. tests/vectors/nip44.vectors.json is the NIP-44 reference vectors file
unchanged, pinned by its sha256.
"""

from __future__ import annotations

import base64
import hashlib
import hmac as std_hmac
import json
from pathlib import Path
from typing import Any

import pytest
from coincurve import PrivateKey
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from app.marmot import nip44, secp

VECTORS_FILE = Path(__file__).resolve().parent / "vectors" / "nip44.vectors.json"
VECTORS_SHA256 = "269ed0f69e4c192512cc779e78c555090cebc7c785b609e338a62afc3ce25040"


def _vectors() -> dict[str, Any]:
    raw = VECTORS_FILE.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == VECTORS_SHA256
    document: dict[str, Any] = json.loads(raw)["v2"]
    return document


V2 = _vectors()
VALID, INVALID = V2["valid"], V2["invalid"]


def _ids(cases: list[dict[str, Any]], field: str) -> list[str]:
    return [f"{i}-{c.get(field, '')[:24]}" for i, c in enumerate(cases)]


def test_every_group_of_the_file_is_covered() -> None:
    assert set(VALID) == {
        "get_conversation_key",
        "get_message_keys",
        "calc_padded_len",
        "encrypt_decrypt",
        "encrypt_decrypt_long_msg",
    }
    assert set(INVALID) == {"encrypt_msg_lengths", "get_conversation_key", "decrypt"}


@pytest.mark.parametrize(
    "case", VALID["get_conversation_key"], ids=_ids(VALID["get_conversation_key"], "note")
)
def test_conversation_keys(case: dict[str, str]) -> None:
    key = nip44.conversation_key(bytes.fromhex(case["sec1"]), bytes.fromhex(case["pub2"]))
    assert key.hex() == case["conversation_key"]


@pytest.mark.parametrize(
    "case", INVALID["get_conversation_key"], ids=_ids(INVALID["get_conversation_key"], "note")
)
def test_invalid_conversation_keys_are_refused(case: dict[str, str]) -> None:
    with pytest.raises(nip44.Nip44Error):
        nip44.conversation_key(bytes.fromhex(case["sec1"]), bytes.fromhex(case["pub2"]))


def test_an_invalid_scalar_is_refused_with_a_valid_public_key() -> None:
    public = secp.xonly_public_key(bytes(31) + b"\x02")
    order = bytes.fromhex("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141")
    for secret in (bytes(32), order, b"\xff" * 32, bytes(31) + b"\x01" + b"\x00"):
        with pytest.raises(nip44.Nip44Error):
            nip44.conversation_key(secret, public)


def test_the_shared_x_is_raw_symmetric_and_not_coincurves_hashed_form() -> None:
    a, b = bytes(31) + b"\x03", bytes(31) + b"\x05"
    a_x, b_x = secp.xonly_public_key(a), secp.xonly_public_key(b)
    shared = secp.shared_x(a, b_x)
    assert shared == secp.shared_x(b, a_x)
    # a*(b*G) and a*(-(b*G)) share their X whatever the lifted Y's parity: the raw X is the
    # compressed point's body; coincurve's own ecdh() hashes it, which Marmot and NIP-44 must not.
    point = PrivateKey(a).public_key.multiply(b).format(compressed=True)
    assert shared == point[1:]
    assert shared != PrivateKey(a).ecdh(b"\x02" + b_x)


def test_the_shared_x_is_what_cryptographys_ecdh_exchange_gives() -> None:
    # The raw X comes through coincurve's cffi module (secp.py): checked against a public API.
    curve = ec.SECP256K1()
    for _ in range(50):
        secret, peer_x = secp.fresh_secret(), secp.xonly_public_key(secp.fresh_secret())
        private = ec.derive_private_key(int.from_bytes(secret, "big"), curve)
        peer = ec.EllipticCurvePublicKey.from_encoded_point(curve, b"\x02" + peer_x)
        assert secp.shared_x(secret, peer_x) == private.exchange(ec.ECDH(), peer)


def test_a_valid_secret_is_exactly_one_to_n_minus_one() -> None:
    order = int("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", 16)
    for value, valid in ((0, False), (1, True), (order - 1, True), (order, False), (2**256 - 1, False)):
        assert secp.valid_secret(value.to_bytes(32, "big")) is valid, value
    assert not secp.valid_secret(bytes(30) + b"\x01") and not secp.valid_secret(bytes(32) + b"\x01")


def test_message_keys() -> None:
    group = VALID["get_message_keys"]
    key = bytes.fromhex(group["conversation_key"])
    assert len(group["keys"]) >= 30
    for case in group["keys"]:
        keys = nip44.message_keys(key, bytes.fromhex(case["nonce"]))
        assert keys.chacha_key.hex() == case["chacha_key"]
        assert keys.chacha_nonce.hex() == case["chacha_nonce"]
        assert keys.hmac_key.hex() == case["hmac_key"]


@pytest.mark.parametrize(("length", "padded"), VALID["calc_padded_len"])
def test_padded_lengths(length: int, padded: int) -> None:
    assert nip44.padded_length(length) == padded


@pytest.mark.parametrize("case", VALID["encrypt_decrypt"], ids=_ids(VALID["encrypt_decrypt"], "plaintext"))
def test_encrypt_and_decrypt(case: dict[str, str]) -> None:
    sec1, sec2 = bytes.fromhex(case["sec1"]), bytes.fromhex(case["sec2"])
    key = nip44.conversation_key(sec1, secp.xonly_public_key(sec2))
    assert key.hex() == case["conversation_key"]
    assert nip44.conversation_key(sec2, secp.xonly_public_key(sec1)) == key
    plaintext = case["plaintext"].encode()
    assert nip44.encrypt(plaintext, key, bytes.fromhex(case["nonce"])) == case["payload"]
    assert nip44.decrypt(case["payload"], key) == plaintext


@pytest.mark.parametrize(
    "case", VALID["encrypt_decrypt_long_msg"], ids=_ids(VALID["encrypt_decrypt_long_msg"], "pattern")
)
def test_long_messages(case: dict[str, Any]) -> None:
    plaintext = (case["pattern"] * case["repeat"]).encode()
    assert hashlib.sha256(plaintext).hexdigest() == case["plaintext_sha256"]
    key = bytes.fromhex(case["conversation_key"])
    payload = nip44.encrypt(plaintext, key, bytes.fromhex(case["nonce"]))
    assert hashlib.sha256(payload.encode()).hexdigest() == case["payload_sha256"]
    assert nip44.decrypt(payload, key) == plaintext


@pytest.mark.parametrize("case", INVALID["decrypt"], ids=_ids(INVALID["decrypt"], "note"))
def test_invalid_payloads_are_refused(case: dict[str, str]) -> None:
    with pytest.raises(nip44.Nip44Error) as refused:
        nip44.decrypt(case["payload"], bytes.fromhex(case["conversation_key"]))
    assert not case["payload"] or case["payload"][:8] not in str(refused.value)


KEY = bytes(range(32))


def test_an_empty_plaintext_is_refused() -> None:
    assert 0 in INVALID["encrypt_msg_lengths"]
    with pytest.raises(nip44.Nip44Error, match="invalid plaintext length"):
        nip44.encrypt(b"", KEY)


@pytest.mark.parametrize("length", [n for n in INVALID["encrypt_msg_lengths"] if n >= 65536])
def test_lengths_of_65536_and_more_round_trip_with_the_extended_prefix(length: int) -> None:
    plaintext = bytes([length % 251]) * length
    nonce = bytes(32)
    payload = nip44.encrypt(plaintext, KEY, nonce)
    assert nip44.decrypt(payload, KEY) == plaintext
    keys = nip44.message_keys(KEY, nonce)
    padded = _chacha20_decrypt(keys, base64.b64decode(payload)[33:-32])
    assert padded[:6] == bytes(2) + length.to_bytes(4, "big")
    assert len(padded) == 6 + nip44.padded_length(length)


def test_the_longest_short_form_keeps_the_u16_prefix() -> None:
    plaintext = b"y" * 65535
    payload = nip44.encrypt(plaintext, KEY, bytes(32))
    padded = _chacha20_decrypt(nip44.message_keys(KEY, bytes(32)), base64.b64decode(payload)[33:-32])
    assert padded[:2] == b"\xff\xff"
    assert nip44.decrypt(payload, KEY) == plaintext


def _chacha20_decrypt(keys: nip44.MessageKeys, data: bytes) -> bytes:
    cipher = Cipher(algorithms.ChaCha20(keys.chacha_key, bytes(4) + keys.chacha_nonce), mode=None)
    return cipher.decryptor().update(data)


def _sealed(padded: bytes, key: bytes = KEY, nonce: bytes = bytes(32)) -> str:
    """A payload whose MAC is right around an arbitrary padded buffer, to test the unpadding."""
    keys = nip44.message_keys(key, nonce)
    ciphertext = _chacha20_decrypt(keys, padded)  # ChaCha20 is its own inverse
    mac = std_hmac.new(keys.hmac_key, nonce + ciphertext, "sha256").digest()
    return base64.b64encode(b"\x02" + nonce + ciphertext + mac).decode()


def test_the_extended_prefix_is_refused_for_a_length_the_u16_carries() -> None:
    padded = bytes(2) + (5).to_bytes(4, "big") + b"hello" + bytes(32 - 5)
    with pytest.raises(nip44.Nip44Error, match="invalid padding"):
        nip44.decrypt(_sealed(padded), KEY)
    good = (5).to_bytes(2, "big") + b"hello" + bytes(27)
    assert nip44.decrypt(_sealed(good), KEY) == b"hello"


@pytest.mark.parametrize(
    "padded",
    [
        bytes(34),
        (40).to_bytes(2, "big") + b"x" * 40 + bytes(23),
        (40).to_bytes(2, "big") + b"x" * 40 + bytes(25),
        (33).to_bytes(2, "big") + bytes(32),
        bytes(2) + (70000).to_bytes(4, "big") + bytes(64),
    ],
    ids=["length zero", "one byte short", "one byte long", "claims more", "extended, far too short"],
)
def test_a_prefix_that_disagrees_with_the_size_is_refused(padded: bytes) -> None:
    with pytest.raises(nip44.Nip44Error, match="invalid padding"):
        nip44.decrypt(_sealed(padded), KEY)


def test_the_mac_is_checked_before_decrypting() -> None:
    payload = base64.b64decode(nip44.encrypt(b"hello", KEY, bytes(32)))
    for flipped in (33, len(payload) - 1, 1):
        bad = bytearray(payload)
        bad[flipped] ^= 1
        with pytest.raises(nip44.Nip44Error, match="invalid MAC"):
            nip44.decrypt(base64.b64encode(bytes(bad)).decode(), KEY)
    with pytest.raises(nip44.Nip44Error, match="invalid MAC"):
        nip44.decrypt(base64.b64encode(payload).decode(), bytes(32))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("", "unknown encryption version"),
        ("#" + "A" * 200, "unknown encryption version"),
        ("A" * 131, "invalid payload length"),
        ("A" * 200 + "!", "invalid base64"),
        ("A" * 201, "invalid base64"),  # not a multiple of four
        ("AQ" + "A" * 198, "unknown encryption version"),
    ],
)
def test_malformed_payloads_are_refused(payload: str, reason: str) -> None:
    with pytest.raises(nip44.Nip44Error, match=reason):
        nip44.decrypt(payload, KEY)


def test_random_nonces_differ_and_decrypt() -> None:
    first, second = nip44.encrypt(b"same", KEY), nip44.encrypt(b"same", KEY)
    assert first != second
    assert nip44.decrypt(first, KEY) == nip44.decrypt(second, KEY) == b"same"
