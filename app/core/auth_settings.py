"""The values of the XMTP_PUSH_AUTH_* settings, read and checked (docs/callers.md#who-may-call).

Each parser takes what the environment or the TOML file gave and returns a typed value, or raises
ValueError with a message that names what is wrong and never quotes a value: an API key, a PEM or a
URL is never echoed (a key's name is, being an operator's label). `AuthSettings`, a part of the one
Settings object (app/core/config.py), applies them only while XMTP_PUSH_AUTH_ENABLED is true.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Self
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode

# The six JWT algorithms accepted, each with the test its public key must pass.
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def _rsa(key: object) -> bool:
    return isinstance(key, rsa.RSAPublicKey)


def _curve(curve: type[ec.EllipticCurve]) -> Callable[[object], bool]:
    return lambda key: isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, curve)


def _ed25519(key: object) -> bool:
    return isinstance(key, ed25519.Ed25519PublicKey)


KEY_FITS_ALG: dict[str, Callable[[object], bool]] = {
    "RS256": _rsa,
    "RS384": _rsa,
    "RS512": _rsa,
    "ES256": _curve(ec.SECP256R1),
    "ES384": _curve(ec.SECP384R1),
    "EdDSA": _ed25519,
}
ALGORITHMS = tuple(KEY_FITS_ALG)
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MIN_KEY_BYTES, MAX_KEY_BYTES, MAX_API_KEYS = 32, 8192, 256
MAX_KID_BYTES = 256
FROM_VARIABLE = "env:"
PEM_HEADER = "-----BEGIN PUBLIC KEY-----"


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str  # the operator's label: may be logged
    value: bytes = field(repr=False)  # never logged, shown or compared except by digest


@dataclass(frozen=True, slots=True)
class InlineKey:
    kid: str
    alg: str
    public_key: PublicKey = field(repr=False)


def _document(value: Any, opening: str, what: str) -> Any:
    """JSON text (it starts with `opening`), the path of a file holding it, or what TOML gave."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text.startswith(opening):
        try:
            text = Path(text).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError, ValueError):
            raise ValueError(f"neither {what} nor a readable file holding one") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"not valid JSON ({what})") from None


def parse_api_keys(value: Any) -> tuple[ApiKey, ...] | None:
    if value is None or isinstance(value, tuple):
        return value
    document = _document(value, "{", "a JSON object of names and values")
    if not isinstance(document, Mapping):
        raise ValueError("not a JSON object of names and values")
    if len(document) > MAX_API_KEYS:
        raise ValueError(f"more than {MAX_API_KEYS} keys")
    keys = tuple(_api_key(name, raw) for name, raw in document.items())
    if len({key.value for key in keys}) != len(keys):
        raise ValueError("two keys have the same value")
    return keys


def _api_key(name: Any, raw: Any) -> ApiKey:
    if not isinstance(name, str) or not KEY_NAME.fullmatch(name):
        raise ValueError(
            "a key's name is not 1..64 letters, digits, '.', '_' or '-' (starting with one of the first two)"
        )
    if isinstance(raw, str) and raw.startswith(FROM_VARIABLE):
        variable = raw.removeprefix(FROM_VARIABLE)
        raw = os.environ.get(variable, "") if variable else ""
        if not raw:
            raise ValueError(f'key "{name}" names a variable that is unset or empty')
    if not isinstance(raw, str):
        raise ValueError(f'key "{name}" is not a string')
    value = raw.encode("utf-8")
    if len(value) < MIN_KEY_BYTES:
        raise ValueError(f'key "{name}" is shorter than {MIN_KEY_BYTES} bytes')
    if len(value) > MAX_KEY_BYTES:
        raise ValueError(f'key "{name}" is longer than {MAX_KEY_BYTES} bytes')
    if any(byte < 0x21 or byte > 0x7E for byte in value):
        raise ValueError(f'key "{name}" holds a byte outside visible ASCII')
    return ApiKey(name, value)


def parse_inline_keys(value: Any) -> tuple[InlineKey, ...] | None:
    if value is None or isinstance(value, tuple):
        return value
    document = _document(value, "[", "a JSON array of keys")
    if not isinstance(document, list):
        raise ValueError("not a JSON array of keys")
    if not document:
        raise ValueError("holds no key")
    keys = tuple(_inline_key(index, entry) for index, entry in enumerate(document, 1))
    if len({key.kid for key in keys}) != len(keys):
        raise ValueError("two keys have the same kid")
    return keys


def _inline_key(index: int, entry: Any) -> InlineKey:
    where = f"key {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} is not an object with kid, alg and public_key")
    kid, alg, pem = entry.get("kid"), entry.get("alg"), entry.get("public_key")
    if not isinstance(kid, str) or not 1 <= len(kid.encode("utf-8")) <= MAX_KID_BYTES:
        raise ValueError(f"{where}: kid is missing or not 1..{MAX_KID_BYTES} bytes")
    if alg not in KEY_FITS_ALG:
        raise ValueError(f"{where}: alg is not one of {', '.join(ALGORITHMS)}")
    if not isinstance(pem, str) or not pem.strip().startswith(PEM_HEADER):
        raise ValueError(f"{where}: public_key is not a PEM public key ({PEM_HEADER})")
    try:
        public_key = load_pem_public_key(pem.strip().encode("ascii"))
    except (ValueError, UnicodeEncodeError, TypeError):
        raise ValueError(f"{where}: public_key is not a readable PEM public key") from None
    if not KEY_FITS_ALG[alg](public_key):
        raise ValueError(f"{where}: public_key is not a key of the type {alg} needs")
    return InlineKey(kid, alg, public_key)  # type: ignore[arg-type]  # KEY_FITS_ALG checked its type


def check_jwks_url(value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - reading it validates it
    except ValueError:
        raise ValueError("not a well-formed URL") from None
    if not parts.hostname or any(c.isspace() for c in text):
        raise ValueError("not a well-formed URL with a host")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError("http:// is allowed only for localhost or a loopback address: use https://")
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an https:// URL")
    return text


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_list(value: Any) -> Any:
    """Comma-separated text (or a TOML array) as a tuple of its non-empty entries."""
    if isinstance(value, str):
        value = value.split(",")
    if isinstance(value, list | tuple):
        return tuple(str(part).strip() for part in value if str(part).strip())
    return value


def split_required_list(value: Any) -> Any:
    """As split_list, but a value given with no entry is a mistake (unset means "do not check")."""
    entries = split_list(value)
    if value is not None and entries == ():
        raise ValueError("is set but holds no entry (leave it unset not to check)")
    return entries


def least_max_stale(refresh_seconds: int) -> int:
    """The smallest max-stale that leaves a refresh (with its jitter) and one more try time to land."""
    return refresh_seconds + -(-refresh_seconds // 10) + 10


class AuthSettings(BaseSettings):
    """The XMTP_PUSH_AUTH_* settings, a part of the one Settings object (app.core.config)."""

    # Caller authentication of NotificationService (docs/callers.md#who-may-call). While AUTH_ENABLED is
    # false no other auth_ setting is read or checked (`_auth_only_when_enabled`).
    auth_enabled: bool = False
    auth_api_keys: Annotated[tuple[ApiKey, ...] | None, NoDecode, PlainValidator(parse_api_keys)] = None
    auth_jwks_url: Annotated[str | None, AfterValidator(check_jwks_url)] = None
    auth_keys: Annotated[tuple[InlineKey, ...] | None, NoDecode, PlainValidator(parse_inline_keys)] = None
    auth_audiences: Annotated[tuple[str, ...] | None, NoDecode, BeforeValidator(split_required_list)] = None
    auth_issuers: Annotated[tuple[str, ...] | None, NoDecode, BeforeValidator(split_required_list)] = None
    auth_required_scopes: Annotated[tuple[str, ...], NoDecode, BeforeValidator(split_list)] = ()
    auth_leeway_seconds: int = Field(60, ge=0, le=300)
    auth_jwks_refresh_seconds: int = Field(300, ge=1)
    auth_jwks_max_stale_seconds: int = 3600

    @model_validator(mode="before")
    @classmethod
    def _auth_only_when_enabled(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        enabled = next((value for key, value in data.items() if str(key).lower() == "auth_enabled"), False)
        try:
            on = TypeAdapter(bool).validate_python(enabled)
        except ValidationError:
            return data  # the field's own check names it
        if on:
            return data
        return {key: value for key, value in data.items() if not _is_auth_setting(key)}

    @field_validator("auth_jwks_max_stale_seconds")
    @classmethod
    def _check_max_stale(cls, value: int, info: ValidationInfo) -> int:
        least = least_max_stale(int(info.data.get("auth_jwks_refresh_seconds") or 1))
        if value < least:
            raise ValueError(f"must be at least {least} (refresh + a tenth of it + 10 s)")
        return value

    @model_validator(mode="after")
    def _check_auth_sources(self) -> Self:
        if not self.auth_enabled:
            return self
        if not (self.auth_api_keys or self.auth_jwks_url or self.auth_keys):
            raise ValueError(
                "XMTP_PUSH_AUTH_ENABLED: needs XMTP_PUSH_AUTH_API_KEYS, XMTP_PUSH_AUTH_JWKS_URL or "
                "XMTP_PUSH_AUTH_KEYS"
            )
        if self.auth_jwks_url and self.auth_keys:
            raise ValueError(
                "XMTP_PUSH_AUTH_KEYS: not together with XMTP_PUSH_AUTH_JWKS_URL (one JWT key source)"
            )
        return self


def _is_auth_setting(key: Any) -> bool:
    name = str(key).lower()
    return name.startswith("auth_") and name != "auth_enabled"
