"""Caller authentication's test kit: signing keys of the six JWT algorithms (made with `cryptography`),
tokens signed by the test, and a JWKS server on loopback whose keys the test rotates while it runs."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "EdDSA")
HASHES = {"256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}
CURVES = {"ES256": (ec.SECP256R1, "P-256", 32), "ES384": (ec.SECP384R1, "P-384", 48)}
API_KEY = "k" * 40  # a valid API key value (32..8192 visible ASCII bytes)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(value: int, size: int | None = None) -> str:
    return b64(value.to_bytes(size or (value.bit_length() + 7) // 8, "big"))


@dataclass(frozen=True)
class SigningKey:
    alg: str
    kid: str
    private: Any = field(repr=False)

    def pem(self) -> str:
        public = self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return str(public.decode())

    def jwk(self, **extra: Any) -> dict[str, Any]:
        public = self.private.public_key()
        if self.alg.startswith("RS"):
            numbers = public.public_numbers()
            entry = {"kty": "RSA", "n": _int(numbers.n), "e": _int(numbers.e)}
        elif self.alg in CURVES:
            _, crv, size = CURVES[self.alg]
            numbers = public.public_numbers()
            entry = {"kty": "EC", "crv": crv, "x": _int(numbers.x, size), "y": _int(numbers.y, size)}
        else:
            raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            entry = {"kty": "OKP", "crv": "Ed25519", "x": b64(raw)}
        return {**entry, "alg": self.alg, "kid": self.kid, "use": "sig", **extra}

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        head = {"alg": self.alg, "typ": "JWT", "kid": self.kid, **header}
        head = {name: value for name, value in head.items() if value is not None}
        signing_input = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(claims).encode())}".encode()
        return f"{signing_input.decode()}.{b64(self.signature(signing_input))}"

    def signature(self, data: bytes) -> bytes:
        if self.alg.startswith("RS"):
            return bytes(self.private.sign(data, padding.PKCS1v15(), HASHES[self.alg[2:]]()))
        if self.alg in CURVES:
            r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(HASHES[self.alg[2:]]())))
            size = CURVES[self.alg][2]
            return r.to_bytes(size, "big") + s.to_bytes(size, "big")
        return bytes(self.private.sign(data))


@cache
def _private(alg: str, number: int) -> Any:
    if alg.startswith("RS"):
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if alg in CURVES:
        return ec.generate_private_key(CURVES[alg][0]())
    return ed25519.Ed25519PrivateKey.generate()


def signing_key(alg: str, kid: str | None = None, number: int = 0) -> SigningKey:
    """A key for `alg` (the same one for the same alg and number, made once a session)."""
    return SigningKey(alg, kid or f"{alg.lower()}-{number}", _private(alg, number))


def claims(**changes: Any) -> dict[str, Any]:
    """Claims that pass every check of a default policy: valid for an hour from now."""
    now = int(time.time())
    values: dict[str, Any] = {
        "iss": "https://issuer.example",
        "sub": "user-1",
        "exp": now + 3600,
        "nbf": now - 5,
    }
    values.update(changes)
    return {name: value for name, value in values.items() if value is not None}


def inline_keys(*keys: SigningKey) -> str:
    return json.dumps([{"kid": key.kid, "alg": key.alg, "public_key": key.pem()} for key in keys])


class JwksServer:
    """A JWKS document on loopback: `keys` (JWK entries) may be changed while it serves; `status` other
    than 200 answers that status; `body` replaces the document; `requests` counts the fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.status = 200
        self.body: bytes | None = None
        self.location: str | None = None
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/.well-known/jwks.json"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                body = owner.body if owner.body is not None else json.dumps({"keys": owner.keys}).encode()
                status = 302 if owner.location else owner.status
                self.send_response(status)
                if owner.location:
                    self.send_header("location", owner.location)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def serve(self, *keys: SigningKey) -> None:
        self.keys = [key.jwk() for key in keys]

    @contextmanager
    def running(self) -> Iterator[JwksServer]:
        thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


@contextmanager
def jwks_server(*keys: SigningKey) -> Iterator[JwksServer]:
    server = JwksServer()
    server.serve(*keys)
    with server.running():
        yield server
