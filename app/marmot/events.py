"""Nostr events (NIP-01): the id, BIP-340 signatures, and the shape checks that come before them."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.marmot import secp

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
MAX_KIND = 65535
MAX_CREATED_AT = 2**53 - 1  # the largest integer every JSON reader keeps exact


def _is_int(value: object, high: int) -> bool:
    return type(value) is int and 0 <= value <= high


def _are_tags(tags: object) -> bool:
    return isinstance(tags, list) and all(
        isinstance(tag, list) and all(isinstance(item, str) for item in tag) for tag in tags
    )


def well_formed(event: Mapping[str, Any]) -> bool:
    """Whether `event` has every NIP-01 field in its form: lowercase hex id, pubkey and sig of the
    right lengths, integer created_at and kind, tags as lists of strings, string content."""
    return (
        isinstance(event.get("id"), str)
        and _HEX64.fullmatch(event["id"]) is not None
        and isinstance(event.get("pubkey"), str)
        and _HEX64.fullmatch(event["pubkey"]) is not None
        and isinstance(event.get("sig"), str)
        and _HEX128.fullmatch(event["sig"]) is not None
        and _is_int(event.get("created_at"), MAX_CREATED_AT)
        and _is_int(event.get("kind"), MAX_KIND)
        and _are_tags(event.get("tags"))
        and isinstance(event.get("content"), str)
    )


def serialize(event: Mapping[str, Any]) -> bytes:
    """NIP-01's serialization `[0,pubkey,created_at,kind,tags,content]`: UTF-8 JSON without
    whitespace, non-ASCII characters as they are. ValueError for text UTF-8 cannot carry (a lone
    surrogate)."""
    fields = [0, event["pubkey"], event["created_at"], event["kind"], event["tags"], event["content"]]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def event_id(event: Mapping[str, Any]) -> str:
    """The event's id: SHA-256 of its NIP-01 serialization, as lowercase hex."""
    return hashlib.sha256(serialize(event)).hexdigest()


def verify_event(event: Mapping[str, Any]) -> bool:
    """Whether the event is well formed, its id is the hash of its content and its signature is the
    pubkey's BIP-340 signature of that id. Never raises on hostile input."""
    if not well_formed(event):
        return False
    try:
        digest = event_id(event)
    except ValueError:
        return False
    if digest != event["id"]:
        return False
    return secp.schnorr_verify(
        bytes.fromhex(event["pubkey"]), bytes.fromhex(digest), bytes.fromhex(event["sig"])
    )


def unsigned_event(
    pubkey: str, kind: int, tags: Sequence[Sequence[str]], content: str, created_at: int
) -> dict[str, Any]:
    """An event with its id and no signature (a NIP-59 rumor)."""
    event: dict[str, Any] = {
        "pubkey": pubkey,
        "created_at": created_at,
        "kind": kind,
        "tags": [list(tag) for tag in tags],
        "content": content,
    }
    return {"id": event_id(event), **event}


def sign_event(
    secret: bytes,
    kind: int,
    tags: Sequence[Sequence[str]],
    content: str,
    created_at: int,
    *,
    aux_random: bytes | None = None,
) -> dict[str, Any]:
    """A signed event by the key `secret`. `aux_random` (32 bytes) fixes BIP-340's auxiliary
    randomness for reproducible vectors; fresh randomness otherwise."""
    event = unsigned_event(secp.xonly_public_key(secret).hex(), kind, tags, content, created_at)
    signature = secp.schnorr_sign(secret, bytes.fromhex(event["id"]), aux_random)
    return {**event, "sig": signature.hex()}
