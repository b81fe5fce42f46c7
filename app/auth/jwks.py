"""A JWKS document fetched within its bounds and read into the usable keys (docs/callers.md#key-set).

One fetch: 10 s in all, at most 262144 bytes of body (a larger one fails, read no further), no
redirect followed, at most 256 entries examined and the first 64 usable kept. A non-2xx status, a
timeout, a body over the bound or no usable entry fails the fetch. Nothing of the body is logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from app.auth.keys import KeySet, VerificationKey
from app.auth.signatures import key_from_jwk
from app.core.auth_settings import ALGORITHMS, MAX_KID_BYTES

FETCH_SECONDS = 10.0
MAX_BODY_BYTES = 262_144
MAX_ENTRIES_EXAMINED = 256
MAX_KEYS_KEPT = 64
SHOWN_KID_BYTES = 32
# The key type (and curve) each algorithm's JWK must declare.
KEY_TYPES: dict[str, tuple[str, str | None]] = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "EdDSA": ("OKP", "Ed25519"),
}
log = logging.getLogger(__name__)


class FetchFailed(Exception):
    """A fetch that gave no key set; its message says why in a few words (never the body or URL)."""


def jwks_host(url: str) -> str:
    return urlsplit(url).hostname or "?"


async def fetch_key_set(url: str) -> KeySet:
    try:
        async with asyncio.timeout(FETCH_SECONDS):
            body = await _get(url)
    except TimeoutError:
        raise FetchFailed("timed out") from None
    except aiohttp.ClientError as error:
        raise FetchFailed(type(error).__name__) from None
    except OSError as error:
        raise FetchFailed(error.strerror or type(error).__name__) from None
    return read_key_set(body)


async def _get(url: str) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, allow_redirects=False, headers={"accept": "application/json"}) as response,
    ):
        if not 200 <= response.status < 300:
            raise FetchFailed(f"HTTP {response.status}")
        if (response.content_length or 0) > MAX_BODY_BYTES:
            raise FetchFailed(f"body over {MAX_BODY_BYTES} bytes")
        body = bytearray()
        while chunk := await response.content.read(65_536):
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise FetchFailed(f"body over {MAX_BODY_BYTES} bytes")
        return bytes(body)


def read_key_set(body: bytes) -> KeySet:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise FetchFailed("not a JSON key set") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise FetchFailed("not a JSON key set")
    kept: list[VerificationKey] = []
    skipped: list[str] = []
    for entry in entries[:MAX_ENTRIES_EXAMINED]:
        key = _usable(entry)
        if key is None:
            skipped.append(_shown_kid(entry))
        elif len(kept) < MAX_KEYS_KEPT:
            kept.append(key)
    if skipped:
        log.warning("auth: %d JWKS entries skipped as unusable (kids: %s)", len(skipped), ", ".join(skipped))
    if not kept:
        raise FetchFailed("no usable key")
    return KeySet(tuple(kept))


def _usable(entry: Any) -> VerificationKey | None:
    if not isinstance(entry, Mapping):
        return None
    alg, kid = entry.get("alg"), entry.get("kid")
    if alg not in ALGORITHMS or entry.get("use", "sig") != "sig":
        return None
    kty, crv = KEY_TYPES[alg]
    if entry.get("kty") != kty or (crv is not None and entry.get("crv") != crv):
        return None
    if kid is not None and (not isinstance(kid, str) or len(kid.encode("utf-8")) > MAX_KID_BYTES):
        return None
    public_key = key_from_jwk(alg, entry)
    return None if public_key is None else VerificationKey(kid, alg, public_key)


def _shown_kid(entry: Any) -> str:
    kid = entry.get("kid") if isinstance(entry, Mapping) else None
    if not isinstance(kid, str):
        return "-"
    return ascii(kid.encode("utf-8")[:SHOWN_KID_BYTES].decode("utf-8", "replace"))
