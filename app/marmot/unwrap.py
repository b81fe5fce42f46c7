"""Unwrapping a Marmot trigger (a NIP-59 gift wrap of a kind 446 rumor) in the order of docs/marmot.md#the-trigger, cheap checks
first: no token ECDH or AEAD happens here, and the content's size, base64 form and chunk count are
settled before anyone decrypts a chunk.

wrap (kind 1059, signed by a throwaway key) --NIP-44(server, wrap pubkey)--> seal (kind 13, signed
by the sender, no tags) --NIP-44(server, seal pubkey)--> rumor (kind 446, unsigned, the sender's
pubkey, tags exactly [["v","marmot-push-v1"]], content base64 of 1..32 EncryptedTokens).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from app.marmot import nip44
from app.marmot.events import verify_event
from app.marmot.keys import ServerKey
from app.marmot.tokens import ENCRYPTED_TOKEN_SIZE

WRAP_KIND = 1059
SEAL_KIND = 13
TRIGGER_KIND = 446
TRIGGER_TAGS = [["v", "marmot-push-v1"]]
MAX_CHUNKS = 32
MAX_CONTENT_BYTES = MAX_CHUNKS * ENCRYPTED_TOKEN_SIZE  # 34,688
MAX_CONTENT_CHARS = 4 * -(-MAX_CONTENT_BYTES // 3)  # 46,252: base64 of the largest content


def _payload_chars(plaintext_bytes: int) -> int:
    """The longest NIP-44 payload (base64 characters) around a plaintext of this many bytes."""
    prefix = 2 if plaintext_bytes <= nip44.MAX_SHORT_PLAINTEXT else 6
    raw = 1 + nip44.NONCE_SIZE + prefix + nip44.padded_length(plaintext_bytes) + nip44.MAC_SIZE
    return 4 * -(-raw // 3)


# The largest layers a trigger can need, with room for the JSON around the content (ids, keys,
# a signature, escaped characters): anything larger is refused before it is decrypted.
MAX_RUMOR_BYTES = 65_536
MAX_SEAL_BYTES = _payload_chars(MAX_RUMOR_BYTES) + 2048
MAX_WRAP_CONTENT_CHARS = _payload_chars(MAX_SEAL_BYTES)


class Refused(Exception):
    """A gift wrap that is not a valid trigger for this server. `reason` is a short fixed code that
    carries nothing of the event."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def unwrap_trigger(event: Mapping[str, Any], key: ServerKey) -> bytes:
    """The decoded content of a trigger gift-wrapped to `key`: the concatenated 1084-byte chunks,
    checked for size and form but not decrypted. Refused, with the first failed check's reason."""
    wrap = _checked_wrap(event)
    seal = _json_object(_open(key, wrap, "wrap"), MAX_SEAL_BYTES, "seal")
    _check_seal(seal)
    rumor = _json_object(_open(key, seal, "seal"), MAX_RUMOR_BYTES, "rumor")
    _check_rumor(rumor, seal)
    return decode_content(rumor["content"])


def _checked_wrap(event: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(event, Mapping) or event.get("kind") != WRAP_KIND or type(event["kind"]) is not int:
        raise Refused("wrap_kind")
    content = event.get("content")
    if not isinstance(content, str) or len(content) > MAX_WRAP_CONTENT_CHARS:
        raise Refused("wrap_size")
    if not verify_event(event):
        raise Refused("wrap_signature")
    return event


def _open(key: ServerKey, layer: Mapping[str, Any], name: str) -> bytes:
    """The NIP-44 plaintext of a verified layer's content, with the key its author shares with us."""
    try:
        shared = nip44.conversation_key(key.secret, bytes.fromhex(layer["pubkey"]))
        return nip44.decrypt(layer["content"], shared)
    except nip44.Nip44Error:
        raise Refused(f"{name}_decrypt") from None


def _json_object(plaintext: bytes, limit: int, name: str) -> dict[str, Any]:
    if len(plaintext) > limit:
        raise Refused(f"{name}_size")
    try:
        value = json.loads(plaintext.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep, a huge number
        raise Refused(f"{name}_json") from None
    if not isinstance(value, dict):
        raise Refused(f"{name}_json")
    return value


def _check_seal(seal: Mapping[str, Any]) -> None:
    if seal.get("kind") != SEAL_KIND or type(seal["kind"]) is not int:
        raise Refused("seal_kind")
    if not verify_event(seal):
        raise Refused("seal_signature")
    if seal["tags"] != []:
        raise Refused("seal_tags")


def _check_rumor(rumor: Mapping[str, Any], seal: Mapping[str, Any]) -> None:
    if rumor.get("pubkey") != seal["pubkey"]:
        raise Refused("rumor_pubkey")
    if rumor.get("kind") != TRIGGER_KIND or type(rumor["kind"]) is not int:
        raise Refused("rumor_kind")
    if rumor.get("tags") != TRIGGER_TAGS:
        raise Refused("rumor_tags")
    if not isinstance(rumor.get("content"), str):
        raise Refused("content_base64")


def decode_content(content: str) -> bytes:
    """A trigger's content as bytes: at most 46,252 characters, canonical standard base64 with
    padding (it re-encodes to itself), 1 to 32 whole 1084-byte chunks."""
    if len(content) > MAX_CONTENT_CHARS:
        raise Refused("content_too_long")
    try:
        decoded = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("content_base64") from None
    if base64.b64encode(decoded).decode("ascii") != content:
        raise Refused("content_base64")
    if not decoded:
        raise Refused("content_empty")
    if len(decoded) % ENCRYPTED_TOKEN_SIZE:
        raise Refused("content_length")
    if len(decoded) > MAX_CONTENT_BYTES:
        raise Refused("too_many_chunks")
    return decoded


def split_chunks(content: bytes) -> list[bytes]:
    """The 1084-byte chunks of decoded content, in order (ValueError if it is not whole chunks)."""
    if len(content) % ENCRYPTED_TOKEN_SIZE:
        raise ValueError("content is not a whole number of 1084-byte chunks")
    return [content[i : i + ENCRYPTED_TOKEN_SIZE] for i in range(0, len(content), ENCRYPTED_TOKEN_SIZE)]
