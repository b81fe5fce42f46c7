"""PyJWT (held to 2.15.1 in pyproject.toml, docs/upstream/README.md), used for what it does as the
contract says: checking a signature under one key with one of the six algorithms, and reading a JWK's
key material. Everything PyJWT would decide differently is decided elsewhere, and this is the only
module that imports it:

- the compact form is parsed in app/auth/tokens.py, strictly (PyJWT's base64url decoding skips
  characters outside the alphabet, and it reads a token's header before choosing among our keys);
- claims are typed and checked there, in the contract's order (PyJWT checks `iat`, takes a numeric
  string for `exp` in some paths, and checks in another order);
- the key's type is checked against the algorithm here, at load (PyJWT's EdDSA takes Ed448 too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jwt.algorithms import get_default_algorithms
from jwt.exceptions import InvalidKeyError

from app.core.auth_settings import ALGORITHMS, KEY_FITS_ALG, PublicKey

_ALGORITHMS = {name: algorithm for name, algorithm in get_default_algorithms().items() if name in ALGORITHMS}


def verify(alg: str, key: PublicKey, signing_input: bytes, signature: bytes) -> bool:
    """Whether `signature` (JWS form: raw r||s for ECDSA) signs `signing_input` under `key`."""
    try:
        return bool(_ALGORITHMS[alg].verify(signing_input, key, signature))
    except (ValueError, TypeError, InvalidKeyError):
        return False


def key_from_jwk(alg: str, entry: Mapping[str, Any]) -> PublicKey | None:
    """The public key of a JWK entry for `alg`, or None when its material does not make one of the
    type `alg` needs (a private key's entry gives its public half)."""
    try:
        key = _ALGORITHMS[alg].from_jwk(dict(entry))
    except (InvalidKeyError, ValueError, TypeError, KeyError):
        return None
    public = key.public_key() if hasattr(key, "private_bytes") else key
    return public if KEY_FITS_ALG[alg](public) else None
