"""NIP-44 v2 encrypted payloads, both ways, with the extended length prefix.

secp256k1 ECDH (raw shared X) -> HKDF-Extract(salt "nip44-v2") is the conversation key; per message
HKDF-Expand(conversation key, info = nonce, 76) gives the ChaCha20 key, its nonce and the HMAC key.
The plaintext is length-prefixed (u16 big-endian, or `00 00` then a u32 from 65,536 bytes on, the
newer form that gift wraps of many Marmot chunks need) and zero-padded; the payload is
base64(0x02 || nonce || ciphertext || HMAC-SHA256(nonce || ciphertext)). The MAC is checked, in
constant time, before anything is decrypted.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from app.marmot import secp

VERSION = 2
SALT = b"nip44-v2"
NONCE_SIZE = 32
MAC_SIZE = 32
MIN_PLAINTEXT = 1
MAX_SHORT_PLAINTEXT = 0xFFFF  # the longest plaintext the u16 prefix carries
MAX_PLAINTEXT = 0xFFFFFFFF
_SHORT_PREFIX = 2
_LONG_PREFIX = 6
# version, nonce, the smallest padded plaintext (2 + 32), MAC; and that in base64.
MIN_PAYLOAD_BYTES = 1 + NONCE_SIZE + _SHORT_PREFIX + 32 + MAC_SIZE
MIN_PAYLOAD_CHARS = 4 * -(-MIN_PAYLOAD_BYTES // 3)


class Nip44Error(ValueError):
    """A payload or key NIP-44 refuses; the message is a fixed phrase and carries no data."""


class MessageKeys(NamedTuple):
    chacha_key: bytes
    chacha_nonce: bytes
    hmac_key: bytes


def conversation_key(secret: bytes, public_x: bytes) -> bytes:
    """The key two parties share: HKDF-Extract(salt "nip44-v2", raw ECDH X). HKDF-Extract is
    HMAC-SHA256 keyed by the salt (RFC 5869, 2.2)."""
    try:
        shared = secp.shared_x(secret, public_x)
    except secp.CurveError as e:
        raise Nip44Error(str(e)) from None
    return _hmac(SALT, shared)


def message_keys(conversation_key: bytes, nonce: bytes) -> MessageKeys:
    if len(conversation_key) != 32 or len(nonce) != NONCE_SIZE:
        raise Nip44Error("invalid conversation key or nonce size")
    okm = HKDFExpand(hashes.SHA256(), 76, nonce).derive(conversation_key)
    return MessageKeys(okm[0:32], okm[32:44], okm[44:76])


def padded_length(length: int) -> int:
    """The padded size of a plaintext of `length` bytes (without its length prefix)."""
    if length <= 32:
        return 32
    next_power = 1 << (length - 1).bit_length()
    chunk = 32 if next_power <= 256 else next_power // 8
    return chunk * ((length - 1) // chunk + 1)


def pad(plaintext: bytes) -> bytes:
    length = len(plaintext)
    if not MIN_PLAINTEXT <= length <= MAX_PLAINTEXT:
        raise Nip44Error("invalid plaintext length")
    if length <= MAX_SHORT_PLAINTEXT:
        prefix = length.to_bytes(2, "big")
    else:
        prefix = bytes(2) + length.to_bytes(4, "big")
    return prefix + plaintext + bytes(padded_length(length) - length)


def unpad(padded: bytes) -> bytes:
    """The plaintext of a padded buffer whose prefix and size agree; the extended prefix only for
    lengths the u16 cannot carry."""
    length, prefix = int.from_bytes(padded[:2], "big"), _SHORT_PREFIX
    if length == 0 and len(padded) >= _LONG_PREFIX:
        length, prefix = int.from_bytes(padded[2:6], "big"), _LONG_PREFIX
        if length <= MAX_SHORT_PLAINTEXT:
            raise Nip44Error("invalid padding")
    if length < MIN_PLAINTEXT or len(padded) != prefix + padded_length(length):
        raise Nip44Error("invalid padding")
    return padded[prefix : prefix + length]


def encrypt(plaintext: bytes, conversation_key: bytes, nonce: bytes | None = None) -> str:
    """The NIP-44 v2 payload of `plaintext`; a fresh random nonce unless one is given (tests)."""
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    keys = message_keys(conversation_key, nonce)
    ciphertext = _chacha20(keys, pad(plaintext))
    mac = _hmac(keys.hmac_key, nonce + ciphertext)
    return base64.b64encode(bytes([VERSION]) + nonce + ciphertext + mac).decode("ascii")


def decrypt(payload: str, conversation_key: bytes) -> bytes:
    """The plaintext of a NIP-44 v2 payload; Nip44Error for another version, bad base64, a size no
    payload has, a wrong MAC (checked first) or bad padding. The caller bounds the payload's size."""
    if not payload or payload[0] == "#":
        raise Nip44Error("unknown encryption version")
    if len(payload) < MIN_PAYLOAD_CHARS:
        raise Nip44Error("invalid payload length")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise Nip44Error("invalid base64") from None
    if data[0] != VERSION:
        raise Nip44Error("unknown encryption version")
    if len(data) < MIN_PAYLOAD_BYTES:
        raise Nip44Error("invalid payload length")
    nonce, ciphertext, mac = data[1 : 1 + NONCE_SIZE], data[1 + NONCE_SIZE : -MAC_SIZE], data[-MAC_SIZE:]
    keys = message_keys(conversation_key, nonce)
    _verify_hmac(keys.hmac_key, nonce + ciphertext, mac)
    return unpad(_chacha20(keys, ciphertext))


def _chacha20(keys: MessageKeys, data: bytes) -> bytes:
    # cryptography's ChaCha20 takes a 16-byte nonce: the 32-bit little-endian block counter (0),
    # then the 96-bit nonce (RFC 8439).
    cipher = Cipher(algorithms.ChaCha20(keys.chacha_key, bytes(4) + keys.chacha_nonce), mode=None)
    encryptor = cipher.encryptor()
    return encryptor.update(data) + encryptor.finalize()


def _hmac(key: bytes, data: bytes) -> bytes:
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(data)
    return mac.finalize()


def _verify_hmac(key: bytes, data: bytes, expected: bytes) -> None:
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(data)
    try:
        mac.verify(expected)  # constant time
    except InvalidSignature:
        raise Nip44Error("invalid MAC") from None
