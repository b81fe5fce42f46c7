"""A Standard Webhooks receiver: an aiohttp server on 127.0.0.1 that verifies every request.

Each `endpoint()` is a path of its own with its own signing key, answering as scripted: a status per
request, a delay per request (held until `release()`), a hook awaited before answering. Every request
that verifies is recorded on its endpoint (body, lower-cased headers, the verified payload, arrival
time); one that does not verify, or is not a POST, is a failure, and one to an unknown path a stray.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook

from fakes.tls import TlsFiles, server_context

_paths = itertools.count(1)


@dataclass
class Received:
    path: str
    body: bytes
    headers: dict[str, str]  # names lower-cased
    payload: dict[str, Any]
    at: float  # time.monotonic() on arrival
    status: int
    key: bytes  # the endpoint's signing key this request verified with
    answered: bool = False

    @property
    def hint(self) -> tuple[bytes, int, bytes]:
        """(topic, sequence_id, recipient_id) as the body states them."""
        return (
            base64.b64decode(self.payload["topic"]),
            int(self.payload["sequence_id"]),
            bytes.fromhex(self.payload["recipient_id"]),
        )


Hook = Callable[[int], Awaitable[None]]


@dataclass
class Endpoint:
    """One path on the receiver, verified with its own key and answering as scripted."""

    receiver: Receiver
    path: str
    key: bytes
    # Request n is answered statuses[n]; the last one repeats.
    statuses: Sequence[int] = (200,)
    # Request n is held delays[n] seconds (or until the receiver is released); the last one repeats.
    delays: Sequence[float] = (0.0,)
    # Awaited with the request's index before it is answered.
    hook: Hook | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)
    active: int = 0
    # False: a receiver that takes unsigned posts (one that authenticates its caller otherwise); a
    # signature header sent to it is a failure all the same, as a sign of the wrong receiver.
    signed: bool = True

    @property
    def url(self) -> str:
        return f"{self.receiver.base_url}{self.path}"

    def hints(self) -> list[tuple[bytes, int, bytes]]:
        return [r.hint for r in self.requests]


class Receiver:
    """An aiohttp server on 127.0.0.1 that verifies every request with standardwebhooks."""

    def __init__(self, *, tls: TlsFiles | None = None, name: str = "127.0.0.1") -> None:
        """`tls`: HTTPS with the throw-away certificate; `name`: the host its URLs are given with."""
        self.tls, self.name = tls, name
        self.endpoints: dict[str, Endpoint] = {}
        self.failures: list[str] = []  # requests that did not verify
        self.strays: list[str] = []  # requests to paths nobody registered
        self.released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.name}:{self.port}"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        context = server_context(self.tls) if self.tls else None
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        self.released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Receiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def endpoint(
        self,
        statuses: Sequence[int] = (200,),
        *,
        delays: Sequence[float] = (0.0,),
        hook: Hook | None = None,
        key: bytes | None = None,
        response_headers: dict[str, str] | None = None,
        signed: bool = True,
    ) -> Endpoint:
        path = f"/hook/{next(_paths)}"
        endpoint = Endpoint(
            self, path, key or secrets.token_bytes(32), statuses, delays, hook, dict(response_headers or {})
        )
        endpoint.signed = signed
        self.endpoints[path] = endpoint
        return endpoint

    def release(self) -> None:
        """Answer every held request now (and do not hold later ones)."""
        self.released.set()

    def all_requests(self) -> list[Received]:
        return [r for e in self.endpoints.values() for r in e.requests]

    def active(self) -> int:
        return sum(e.active for e in self.endpoints.values())

    @staticmethod
    def _verified(endpoint: Endpoint, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        if endpoint.signed:
            verified: dict[str, Any] = Webhook(endpoint.key).verify(body, headers)
            return verified
        if "webhook-signature" in headers:
            raise ValueError("a signed post to an endpoint that takes unsigned ones")
        parsed: dict[str, Any] = json.loads(body)
        return parsed

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        endpoint = self.endpoints.get(request.path)
        if endpoint is None:
            self.strays.append(request.path)
            return web.Response(status=418)
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            payload = self._verified(endpoint, body, headers)
        except Exception as error:  # any refusal by the library is a failure of the sender
            self.failures.append(f"{request.method} {request.path}: {type(error).__name__}: {error}")
            return web.Response(status=400)
        index = len(endpoint.requests)
        status = endpoint.statuses[min(index, len(endpoint.statuses) - 1)]
        record = Received(request.path, body, headers, payload, time.monotonic(), status, endpoint.key)
        endpoint.requests.append(record)
        endpoint.active += 1
        try:
            if request.method != "POST":
                self.failures.append(f"{request.method} {request.path}: not a POST")
            if endpoint.hook is not None:
                await endpoint.hook(index)
            delay = endpoint.delays[min(index, len(endpoint.delays) - 1)]
            if delay > 0 and not self.released.is_set():
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.released.wait(), delay)
            record.answered = True
            return web.Response(status=status, headers=endpoint.response_headers)
        finally:
            endpoint.active -= 1
