"""The notification server's Nostr key: parsed from 64 hex characters, an `nsec1...` string, or a file
holding either. Errors never carry the value, and neither does the key's repr."""

from __future__ import annotations

import string
from pathlib import Path

import bech32

from app.marmot import secp

NSEC = "nsec"
NPUB = "npub"
# A key file holds one key and maybe a newline; anything much larger is not one.
MAX_KEY_FILE_BYTES = 1024
_HEX_DIGITS = frozenset(string.hexdigits)


class InvalidServerKey(ValueError):
    """The Marmot secret key could not be read; the message names the form, never the value."""


def bech32_encode(prefix: str, data: bytes) -> str:
    """`data` as a Nostr bech32 string (NIP-19) with the human-readable part `prefix`."""
    words = bech32.convertbits(data, 8, 5)
    if words is None:  # only for values over 8 bits, which bytes cannot hold
        raise ValueError("bech32 data is not bytes")
    return bech32.bech32_encode(prefix, words)


def bech32_decode(prefix: str, text: str) -> bytes | None:
    """The 32 bytes a NIP-19 string with the human-readable part `prefix` encodes, or None."""
    found, words = bech32.bech32_decode(text)
    if found != prefix or words is None:
        return None
    data = bech32.convertbits(words, 5, 8, False)
    if data is None or len(data) != secp.KEY_SIZE:
        return None
    return bytes(data)


def _decoded_secret(text: str, source: str) -> bytes | None:
    """The secret `text` spells as hex or nsec1, or None when it has neither form."""
    if len(text) == 2 * secp.KEY_SIZE and set(text) <= _HEX_DIGITS:
        secret = bytes.fromhex(text)
    elif text.lower().startswith(NSEC + "1"):
        decoded = bech32_decode(NSEC, text)
        if decoded is None:
            raise InvalidServerKey(f"{source} is an nsec1 key that does not decode to 32 bytes")
        secret = decoded
    else:
        return None
    if not secp.valid_secret(secret):
        raise InvalidServerKey(f"{source} is not a valid secp256k1 secret (zero, or not below the order)")
    return secret


def _read_key_file(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise InvalidServerKey(
            "the Marmot secret key is not 64 hex characters or an nsec1 key, and no file of that name "
            f"can be read ({type(e).__name__})"
        ) from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise InvalidServerKey(f"the Marmot secret key file is over {MAX_KEY_FILE_BYTES} bytes")
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InvalidServerKey("the Marmot secret key file is not ASCII text") from None


def parse_public_key(text: str) -> bytes:
    """A server's x-only public key from 64 hex characters or `npub1...`; InvalidServerKey (naming the
    forms, not the value) for anything else or a value that is no point of the curve."""
    value = text.strip()
    if len(value) == 2 * secp.KEY_SIZE and set(value) <= _HEX_DIGITS:
        public_x: bytes | None = bytes.fromhex(value)
    else:
        public_x = bech32_decode(NPUB, value.lower()) if value.lower().startswith(NPUB + "1") else None
    if public_x is None:
        raise InvalidServerKey("not a public key (64 hex characters or npub1...)")
    try:
        secp.lift_x(public_x)
    except secp.CurveError:
        raise InvalidServerKey("not a public key: no point of the curve has that X") from None
    return public_x


def key_file_path(text: str) -> Path | None:
    """The file the key setting `text` names, or None when `text` is a key itself (64 hex characters
    or an nsec1 key), which `ServerKey.parse` tries first."""
    value = text.strip()
    try:
        inline = _decoded_secret(value, "the Marmot secret key") is not None
    except InvalidServerKey:
        inline = True  # an nsec1 key that does not decode: no file is read
    return None if inline or not value else Path(value)


class ServerKey:
    """One secp256k1 key: the secret scalar and its x-only public key."""

    __slots__ = ("_public_x", "_secret")

    def __init__(self, secret: bytes) -> None:
        if not secp.valid_secret(secret):
            raise InvalidServerKey("the Marmot secret key is not a valid secp256k1 secret")
        self._secret = secret
        self._public_x = secp.xonly_public_key(secret)

    @classmethod
    def parse(cls, text: str) -> ServerKey:
        """64 hex characters, `nsec1...`, or the path of a file holding either (whitespace around the
        value or the file's content is ignored)."""
        value = text.strip()
        if not value:
            raise InvalidServerKey("the Marmot secret key is empty")
        secret = _decoded_secret(value, "the Marmot secret key")
        if secret is None:
            secret = _decoded_secret(_read_key_file(Path(value)), "the Marmot secret key file's content")
        if secret is None:
            raise InvalidServerKey(
                "the Marmot secret key file does not hold 64 hex characters or an nsec1 key"
            )
        return cls(secret)

    @property
    def secret(self) -> bytes:
        return self._secret

    @property
    def public_x(self) -> bytes:
        """The x-only public key, 32 bytes."""
        return self._public_x

    @property
    def public_hex(self) -> str:
        return self._public_x.hex()

    @property
    def npub(self) -> str:
        return bech32_encode(NPUB, self._public_x)

    def __repr__(self) -> str:
        return f"ServerKey(public_hex={self.public_hex!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServerKey) and other._public_x == self._public_x

    def __hash__(self) -> int:
        return hash(self._public_x)
