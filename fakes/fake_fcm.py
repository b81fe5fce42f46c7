"""A local FCM HTTP v1 endpoint and Google OAuth token endpoint, scripted per registration token.

Plain HTTP (aiohttp); the client (httpx inside firebase-admin) speaks HTTP/1.1 to it. It serves from
its own thread and event loop (`FakeFcm().start()`, or `with FakeFcm() as fake:`): google-auth
fetches OAuth tokens with a blocking `requests` call, which must not wait on the caller's own loop.
It can also run as a separate process (`python -m fakes.fake_fcm`, used by `bench.channels`).

Routes:
- `POST /token`: Google's OAuth token endpoint for a service account (point the account's `token_uri`
  here, see `fakes.keys.service_account`); records the JWT assertion and answers
  `{"access_token": "test-token", "expires_in": 3600, "token_type": "Bearer"}` (another token once
  `revoke_access_token()` was called; `token_delay` stalls the answer, `token_status` refuses).
- `POST /v1/projects/<project>/messages:send`: records headers and the JSON body, and answers by the
  message token's *name*, the part before the first "." (`gone.3` answers like `gone`):

| name | answer |
| --- | --- |
| `ok` (and any unknown name) | 200 `{"name": "projects/<p>/messages/<n>"}` |
| `gone` | 404 NOT_FOUND, FcmError UNREGISTERED |
| `mismatch` | 403 PERMISSION_DENIED, FcmError SENDER_ID_MISMATCH |
| `quota` | 429 RESOURCE_EXHAUSTED, FcmError QUOTA_EXCEEDED (Retry-After from the script, none by default) |
| `unavailable` / `internal` | 503 UNAVAILABLE / 500 INTERNAL |
| `invalid` | 400 INVALID_ARGUMENT, FcmError INVALID_ARGUMENT |
| `denied` | 403 PERMISSION_DENIED with no FCM error code |
| `unauthenticated` | 401 UNAUTHENTICATED with no FCM error code, whatever the access token |
| `slow` | answers 200 after 30 s |

Whatever the name, a request bearing an access token `revoke_access_token()` revoked is answered 401
UNAUTHENTICATED (no FcmError code), as Google answers a token revoked or expired early; and once
`projects` names the projects the fake knows, a request for another project is answered 403
PERMISSION_DENIED (no FcmError code), as FCM answers a project the service account may not send for.

Error bodies have FCM's real shape:
`{"error":{"code":404,"message":"...","status":"NOT_FOUND","details":[{"@type":
"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fakes.loop_thread import run_as_process, serve_in_thread
from fakes.tls import TlsFiles, server_context

FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
ACCESS_TOKEN = "test-token"


@dataclass(frozen=True)
class Reply:
    status: int
    status_name: str | None = None  # google.rpc status, e.g. NOT_FOUND
    fcm_code: str | None = None  # FcmError errorCode, e.g. UNREGISTERED
    retry_after: str | None = None
    delay: float = 0.0
    held: bool = False  # answer when FakeFcm.release() is called

    def body(self, project: str, number: int) -> dict[str, Any]:
        if self.status == 200:
            return {"name": f"projects/{project}/messages/{number}"}
        error: dict[str, Any] = {
            "code": self.status,
            "message": f"fake FCM says {self.fcm_code or self.status_name}",
            "status": self.status_name or "UNKNOWN",
        }
        if self.fcm_code:
            error["details"] = [{"@type": FCM_ERROR_TYPE, "errorCode": self.fcm_code}]
        return {"error": error}


OK = Reply(200)
UNAUTHENTICATED = Reply(401, "UNAUTHENTICATED")
PROJECT_REFUSED = Reply(403, "PERMISSION_DENIED")
DEFAULT_REPLIES: dict[str, tuple[Reply, ...]] = {
    "ok": (OK,),
    "gone": (Reply(404, "NOT_FOUND", "UNREGISTERED"),),
    "mismatch": (Reply(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"),),
    "quota": (Reply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),),
    "unavailable": (Reply(503, "UNAVAILABLE", "UNAVAILABLE"),),
    "internal": (Reply(500, "INTERNAL", "INTERNAL"),),
    "invalid": (Reply(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),),
    "denied": (Reply(403, "PERMISSION_DENIED"),),
    "unauthenticated": (UNAUTHENTICATED,),
    "slow": (Reply(200, delay=30.0),),
}


@dataclass
class FcmRequest:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    received: float

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def token(self) -> str:
        return str(self.json()["message"]["token"])


@dataclass
class TokenRequest:
    form: dict[str, str]
    received: float

    @property
    def assertion(self) -> str:
        return self.form["assertion"]


def token_name(token: str) -> str:
    return token.split(".", 1)[0]


@dataclass
class FakeFcm:
    port: int = 0
    record: bool = True
    requests: list[FcmRequest] = field(default_factory=list)
    token_requests: list[TokenRequest] = field(default_factory=list)
    count: int = 0
    last_ns: int = 0  # time.monotonic_ns() of the latest send request
    unique: set[tuple[str, bytes]] = field(default_factory=set)  # when not recording
    scripts: dict[str, tuple[Reply, ...]] = field(default_factory=dict)
    token_delay: float = 0.0
    token_status: int = 200
    access_token: str = ACCESS_TOKEN  # what the token endpoint issues
    revoked: set[str] = field(default_factory=set)
    projects: set[str] | None = None  # the projects it sends for; None: any
    tls: TlsFiles | None = None  # HTTPS with the throw-away certificate (what a client must trust)
    _seen: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _held: list[asyncio.Future[None]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None

    # ---- scripting

    def script(self, token_or_name: str, *replies: Reply) -> None:
        self.scripts[token_or_name] = replies

    def revoke_access_token(self) -> None:
        """Answer 401 to the access token issued so far, and issue another from now on."""
        self.revoked.add(self.access_token)
        self.access_token = f"{ACCESS_TOKEN}-{len(self.revoked) + 1}"

    def reply_for(self, token: str) -> Reply:
        replies = self.scripts.get(token) or self.scripts.get(token_name(token))
        replies = replies or DEFAULT_REPLIES.get(token_name(token)) or (OK,)
        seen = self._seen[token]
        self._seen[token] = seen + 1
        return replies[min(seen, len(replies) - 1)]

    def reset(self) -> None:
        self.requests.clear()
        self.token_requests.clear()
        self.count = 0
        self.last_ns = 0
        self.unique.clear()
        self.scripts.clear()
        self._seen.clear()
        self.token_delay = 0.0
        self.token_status = 200
        self.access_token = ACCESS_TOKEN
        self.revoked.clear()
        self.projects = None
        self.release()

    def release(self) -> None:
        """Answer every held request now."""
        if self._loop is None:
            return

        def answer() -> None:
            held, self._held = self._held, []
            for waiter in held:
                if not waiter.done():
                    waiter.set_result(None)

        self._loop.call_soon_threadsafe(answer)

    # ---- views

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def token_uri(self) -> str:
        return f"{self.endpoint}/token"

    def requests_for(self, token: str) -> list[FcmRequest]:
        return [r for r in self.requests if r.token == token]

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[FcmRequest]:
        deadline = time.monotonic() + timeout
        while self.count < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fake FCM got {self.count} requests, expected {count}")
            await asyncio.sleep(0.005)
        return list(self.requests)

    # ---- handlers

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(urllib.parse.parse_qsl((await request.read()).decode()))
        self.token_requests.append(TokenRequest(form, time.monotonic()))
        if self.token_delay:
            await asyncio.sleep(self.token_delay)
        if self.token_status != 200:
            # google-auth retries "internal_failure" (after a sleep), not "invalid_grant".
            error = "internal_failure" if self.token_status >= 500 else "invalid_grant"
            return web.json_response({"error": error}, status=self.token_status)
        issued = {"access_token": self.access_token, "expires_in": 3600, "token_type": "Bearer"}
        return web.json_response(issued)

    async def _send(self, request: web.Request) -> web.Response:
        body = await request.read()
        record = FcmRequest(
            request.path, {k.lower(): v for k, v in request.headers.items()}, body, time.monotonic()
        )
        try:
            token = record.token
        except (ValueError, KeyError, TypeError):
            return web.json_response(Reply(400, "INVALID_ARGUMENT").body("", 0), status=400)
        if self.record:
            self.requests.append(record)
        else:
            self.unique.add((token, body))
        self.count += 1
        self.last_ns = time.monotonic_ns()  # CLOCK_MONOTONIC: comparable across processes on Linux
        number = self.count
        _, _, bearer = record.headers.get("authorization", "").partition(" ")
        project = request.match_info["project"]
        if bearer in self.revoked:
            reply = UNAUTHENTICATED
        elif self.projects is not None and project not in self.projects:
            reply = PROJECT_REFUSED
        else:
            reply = self.reply_for(token)
        if reply.held:
            waiter = asyncio.get_running_loop().create_future()
            self._held.append(waiter)
            await waiter
        if reply.delay:
            await asyncio.sleep(reply.delay)
        headers = {"Retry-After": reply.retry_after} if reply.retry_after is not None else None
        return web.json_response(reply.body(project, number), status=reply.status, headers=headers)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        app.add_routes(
            [
                web.post("/token", self._token),
                web.post("/v1/projects/{project}/messages:send", self._send),
            ]
        )
        return app

    # ---- lifecycle

    async def serve(self, extra_routes: list[web.RouteDef] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        app = self.app()
        if extra_routes:
            app.add_routes(extra_routes)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await self._runner.setup()
        context = server_context(self.tls) if self.tls else None
        site = web.TCPSite(
            self._runner, "127.0.0.1", self.port, backlog=1024, reuse_address=True, ssl_context=context
        )
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> FakeFcm:
        self._thread = serve_in_thread("fake-fcm", self.serve, self._cleanup)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self.release()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeFcm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- a separate process


async def _serve_process(args: argparse.Namespace) -> None:
    fake = FakeFcm(port=args.port, record=False)

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "count": fake.count,
                "unique": len(fake.unique),
                "token_requests": len(fake.token_requests),
                "last_ns": fake.last_ns,
            }
        )

    async def reset(_: web.Request) -> web.Response:
        fake.reset()
        return web.json_response({"reset": True})

    await fake.serve([web.get("/stats", stats), web.post("/reset", reset)])
    print(f"fake fcm listening on {fake.port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A local scripted FCM HTTP v1 and OAuth token endpoint")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args(argv)
    run_as_process(_serve_process(args), uvloop=not args.no_uvloop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
