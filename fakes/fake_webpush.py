"""A Web Push service: an aiohttp server on 127.0.0.1 that checks every push as a browser's push
service and the browser would.

Each `subscribe()` is a subscription of its own, as a browser makes one: a P-256 key pair and an
authentication secret, an endpoint URL on this server, and scripted answers (a status per request;
the last repeats). A push is recorded with its headers, the VAPID claims it was authorized with
(checked with py_vapid against the key it names), and the payload decrypted with http_ece using the
subscriber's private key (RFC 8291). A push that does not verify or decrypt is a failure.
"""

from __future__ import annotations

import base64
import itertools
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import http_ece
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02
from py_vapid.jwt import decode as decode_jwt

from app.delivery.types import WebPushKeys
from fakes.tls import TlsFiles, server_context

_ids = itertools.count(1)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass
class Pushed:
    headers: dict[str, str]  # names lower-cased
    body: bytes  # as sent: encrypted
    payload: bytes  # decrypted
    claims: dict[str, Any]  # the verified VAPID claims
    vapid_key: str  # the application server's public key the token named (base64url)
    at: float  # time.monotonic() on arrival


@dataclass
class Subscription:
    service: FakeWebPush
    id: int
    private_key: ec.EllipticCurvePrivateKey
    auth_secret: bytes
    statuses: Sequence[int] = (201,)
    response_headers: dict[str, str] = field(default_factory=dict)
    pushes: list[Pushed] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"{self.service.base_url}/push/{self.id}"

    @property
    def keys(self) -> WebPushKeys:
        public = self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return WebPushKeys(p256dh=b64url(public), auth=b64url(self.auth_secret))


class FakeWebPush:
    """Push endpoints on 127.0.0.1 that verify VAPID and decrypt every push."""

    def __init__(
        self, host: str = "127.0.0.1", *, tls: TlsFiles | None = None, name: str | None = None
    ) -> None:
        """`tls`: HTTPS with the throw-away certificate; `name`: the host its endpoints are given with
        (one resolving to `host`, such as localhost)."""
        self.host, self.tls, self.name = host, tls, name or host
        self.subscriptions: dict[str, Subscription] = {}
        self.failures: list[str] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.name}:{self.port}"

    def subscribe(self, statuses: Sequence[int] = (201,), **response_headers: str) -> Subscription:
        subscription = Subscription(
            self,
            next(_ids),
            ec.generate_private_key(ec.SECP256R1()),
            secrets.token_bytes(16),
            statuses,
            response_headers,
        )
        self.subscriptions[f"/push/{subscription.id}"] = subscription
        return subscription

    def all_pushes(self) -> list[Pushed]:
        return [p for s in self.subscriptions.values() for p in s.pushes]

    async def start(self) -> FakeWebPush:
        app = web.Application(client_max_size=8192)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        context = server_context(self.tls) if self.tls else None
        await web.TCPSite(self._runner, self.host, 0, ssl_context=context).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeWebPush:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.Response:
        subscription = self.subscriptions.get(request.path)
        if subscription is None or request.method != "POST":
            self.failures.append(f"{request.method} to an unknown subscription")
            return web.Response(status=404)
        headers = {name.lower(): value for name, value in request.headers.items()}
        body = await request.read()
        try:
            pushed = self._verify(subscription, headers, body)
        except Exception as error:  # any refusal is the sender's failure
            self.failures.append(f"{type(error).__name__}: {error}")
            return web.Response(status=400)
        subscription.pushes.append(pushed)
        status = subscription.statuses[min(len(subscription.pushes) - 1, len(subscription.statuses) - 1)]
        return web.Response(status=status, headers=subscription.response_headers)

    def _verify(self, subscription: Subscription, headers: dict[str, str], body: bytes) -> Pushed:
        if headers.get("content-encoding") != "aes128gcm":
            raise ValueError("content-encoding is not aes128gcm")
        if not headers.get("ttl", "").isdigit():
            raise ValueError("no TTL header")
        claims, vapid_key = verify_vapid(headers.get("authorization", ""))
        if claims.get("aud") != self.base_url:
            raise ValueError("the VAPID audience is not this push service's origin")
        if not time.time() < claims["exp"] <= time.time() + 24 * 3600:
            raise ValueError("the VAPID token's expiry is not within 24 hours")
        payload = http_ece.decrypt(
            body,
            private_key=subscription.private_key,
            auth_secret=subscription.auth_secret,
            version="aes128gcm",
        )
        return Pushed(headers, body, payload, claims, vapid_key, time.monotonic())


def verify_vapid(authorization: str) -> tuple[dict[str, Any], str]:
    """The claims of an RFC 8292 `vapid t=...,k=...` header, checked against the key it names."""
    if not Vapid02.verify(authorization):
        raise ValueError("the VAPID signature does not verify")
    fields = dict(part.split("=", 1) for part in authorization.split(" ", 1)[1].split(","))
    claims: dict[str, Any] = decode_jwt(fields["t"], fields["k"])
    return claims, fields["k"]
