"""The `authorization` header's bearer form: exactly one header, `Bearer` in any case, one space, then
the token trimmed of spaces and tabs, visible ASCII only, at most 8192 bytes."""

from __future__ import annotations

from collections.abc import Sequence

from app.auth.rejections import BAD_TOKEN, NO_HEADER, NOT_BEARER, Rejected

SCHEME = b"bearer "
MAX_TOKEN_BYTES = 8192


def bearer_token(values: Sequence[bytes]) -> bytes:
    """The token of the call's `authorization` values (every header of that name, in order)."""
    if not values:
        raise Rejected(NO_HEADER)
    if len(values) > 1:
        raise Rejected(NOT_BEARER)
    value = values[0]
    if value[: len(SCHEME)].lower() != SCHEME:
        raise Rejected(NOT_BEARER)
    token = value[len(SCHEME) :].strip(b" \t")
    if not token or any(byte < 0x21 or byte > 0x7E for byte in token):
        raise Rejected(NOT_BEARER)
    if len(token) > MAX_TOKEN_BYTES:
        raise Rejected(BAD_TOKEN)
    return token
