"""secp256k1 through coincurve (libsecp256k1): x-only keys, BIP-340 Schnorr, and ECDH that yields the
raw shared X coordinate.

Marmot's token layer and NIP-44 both need the unhashed X of the shared point. No public API gives it
at this cost and in constant time: coincurve's `PrivateKey.ecdh()` returns SHA-256 of the compressed
point, and takes no hash function; its `PublicKey.multiply()` gives the point, but libsecp256k1's
tweak multiplication is variable-time in the scalar, here the server's long-term key (3 * P takes a
seventh of the time of a full scalar); `cryptography`'s `ec.ECDH` exchange is constant-time and
returns X, but OpenSSL's generic curve code makes it five times slower (about 370 us a call with the
private key parsed once, against 70 us), which would take some 40 % off the Marmot server's rate. So
`secp256k1_ecdh` is called with a hash function of ours (a cffi callback on coincurve's own cffi
module) that copies X through unchanged. That reaches into coincurve's internals, which is why the
version is pinned in pyproject.toml and why this is the only module that touches them; everything
else here uses coincurve's public API, and the tests check the X against `cryptography`'s exchange.
"""

from __future__ import annotations

import os
from typing import Any

from coincurve import PrivateKey, PublicKey, PublicKeyXOnly
from coincurve._libsecp256k1 import ffi, lib
from coincurve.context import GLOBAL_CONTEXT

KEY_SIZE = 32
SIGNATURE_SIZE = 64
_EVEN_Y = b"\x02"
_ZERO = bytes(KEY_SIZE)
_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # the group's order, n


class CurveError(ValueError):
    """An invalid scalar or public key, or an ECDH that failed or gave the point's X as zero."""


@ffi.callback("int(unsigned char *, unsigned char *, unsigned char *, void *)")  # type: ignore[untyped-decorator]
def _copy_x(output: Any, x32: Any, _y32: Any, _data: Any) -> int:
    ffi.memmove(output, x32, KEY_SIZE)
    return 1


def _scalar(secret: bytes) -> bytes:
    if len(secret) != KEY_SIZE or not valid_secret(secret):
        raise CurveError("invalid secret scalar")
    return secret


def valid_secret(secret: bytes) -> bool:
    """1 <= secret < n, as 32 big-endian bytes (the check coincurve's own key constructors make)."""
    return len(secret) == KEY_SIZE and 0 < int.from_bytes(secret, "big") < _ORDER


def fresh_secret() -> bytes:
    """A random valid secret scalar."""
    while not valid_secret(secret := os.urandom(KEY_SIZE)):
        pass  # one draw in 2**128 lands outside [1, n)
    return secret


def lift_x(public_x: bytes) -> PublicKey:
    """The point with X `public_x` and even Y (BIP-340); CurveError if no such point exists."""
    if len(public_x) != KEY_SIZE:
        raise CurveError("invalid x-only public key")
    try:
        return PublicKey(_EVEN_Y + public_x)
    except ValueError:
        raise CurveError("invalid x-only public key") from None


def shared_x(secret: bytes, public_x: bytes) -> bytes:
    """The X coordinate of secret * lift_x(public_x), unhashed. Refuses an invalid scalar or key, a
    failed ECDH and an all-zero result, so none of them reaches a KDF."""
    point = lift_x(public_x)
    output = ffi.new("unsigned char [32]")
    done = lib.secp256k1_ecdh(
        GLOBAL_CONTEXT.ctx, output, point.public_key, _scalar(secret), _copy_x, ffi.NULL
    )
    result = bytes(ffi.buffer(output, KEY_SIZE))
    if not done or result == _ZERO:
        raise CurveError("ECDH failed")
    return result


def xonly_public_key(secret: bytes) -> bytes:
    """The x-only (BIP-340) public key of a secret scalar."""
    return PublicKeyXOnly.from_secret(_scalar(secret)).format()


def schnorr_sign(secret: bytes, message32: bytes, aux_random: bytes | None = None) -> bytes:
    """A BIP-340 signature over a 32-byte message; fresh auxiliary randomness unless given."""
    key = PrivateKey(_scalar(secret))
    return key.sign_schnorr(message32, b"" if aux_random is None else aux_random)


def schnorr_verify(public_x: bytes, message32: bytes, signature: bytes) -> bool:
    """Whether `signature` is a valid BIP-340 signature of `message32` by `public_x`; False for an
    invalid key or a signature of the wrong size."""
    if len(public_x) != KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        key = PublicKeyXOnly(public_x)
    except ValueError:
        return False
    return key.verify(signature, message32)
