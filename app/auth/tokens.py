"""A JWT checked in the contract's order (docs/callers.md#jwts): its syntax, its algorithm, one key,
the signature, then the claims' types and the claims themselves. The earliest failing stage decides."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.auth import rejections as r
from app.auth.keys import KeySet
from app.auth.rejections import Rejected
from app.auth.signatures import verify
from app.core.auth_settings import ALGORITHMS, MAX_KID_BYTES

SEGMENT = re.compile(rb"[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    leeway_seconds: int
    audiences: tuple[str, ...] | None
    issuers: tuple[str, ...] | None
    required_scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Header:
    alg: str
    kid: str | None


def verify_jwt(token: bytes, keys: KeySet, policy: ClaimPolicy, now: float) -> Claims:
    """The admitted token's claims; raises Rejected with the earliest stage's rejection."""
    header, claims, signing_input, signature = _parse(token)
    if header.alg not in ALGORITHMS:
        raise Rejected(r.BAD_ALG)
    key = keys.choose(header.kid, header.alg)
    if key is None or not verify(header.alg, key.public_key, signing_input, signature):
        raise Rejected(r.NOT_TRUSTED)
    typed = _typed(claims)
    _check_claims(typed, policy, now)
    return typed


def _parse(token: bytes) -> tuple[Header, dict[str, Any], bytes, bytes]:
    parts = token.split(b".")
    if len(parts) != 3 or not all(SEGMENT.fullmatch(part) for part in parts):
        raise Rejected(r.BAD_TOKEN)
    header, claims = _json_object(parts[0]), _json_object(parts[1])
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str):
        raise Rejected(r.BAD_TOKEN)
    if kid is not None and (not isinstance(kid, str) or len(kid.encode("utf-8")) > MAX_KID_BYTES):
        raise Rejected(r.BAD_TOKEN)
    return Header(alg, kid), claims, parts[0] + b"." + parts[1], _decode(parts[2])


def _decode(segment: bytes) -> bytes:
    if len(segment) % 4 == 1:
        raise Rejected(r.BAD_TOKEN)
    try:
        return base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise Rejected(r.BAD_TOKEN) from None


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are not JSON


def _json_object(segment: bytes) -> dict[str, Any]:
    try:
        document = json.loads(_decode(segment), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Rejected(r.BAD_TOKEN) from None
    if not isinstance(document, dict):
        raise Rejected(r.BAD_TOKEN)
    return document


@dataclass(frozen=True, slots=True)
class Claims:
    exp: int | None
    nbf: int | None
    aud: tuple[str, ...] | None
    iss: str | None
    sub: str | None
    scope: frozenset[str]


def _typed(claims: dict[str, Any]) -> Claims:
    for name in ("iss", "sub"):
        if name in claims and not isinstance(claims[name], str):
            raise Rejected(r.BAD_TOKEN)
    scope = _strings(claims, "scope", str.split)
    return Claims(
        exp=_seconds(claims, "exp"),
        nbf=_seconds(claims, "nbf"),
        aud=_strings(claims, "aud", lambda text: [text]),
        iss=claims.get("iss"),
        sub=claims.get("sub"),
        scope=frozenset(scope or ()),
    )


def _seconds(claims: dict[str, Any], name: str) -> int | None:
    """A finite number >= 0, to the nearest second."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise Rejected(r.BAD_TOKEN)
    return math.floor(value + 0.5)


def _strings(claims: dict[str, Any], name: str, split: Callable[[str], list[str]]) -> tuple[str, ...] | None:
    """A string (split as the claim reads it) or an array of strings."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, str):
        return tuple(split(value))
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise Rejected(r.BAD_TOKEN)


def _check_claims(claims: Claims, policy: ClaimPolicy, now: float) -> None:
    leeway = policy.leeway_seconds
    if claims.exp is None or claims.exp < now - leeway:
        raise Rejected(r.HAS_EXPIRED)
    if claims.nbf is not None and claims.nbf > now + leeway:
        raise Rejected(r.NOT_YET)
    if policy.audiences is not None and not set(claims.aud or ()) & set(policy.audiences):
        raise Rejected(r.WRONG_AUDIENCE)
    if policy.issuers is not None and claims.iss not in policy.issuers:
        raise Rejected(r.WRONG_ISSUER)
    if not set(policy.required_scopes) <= claims.scope:
        raise Rejected(r.MISSING_SCOPE)
