"""Caller authentication on the HTTP port: every request to a NotificationService path (the Connect
routes, any method name, verb or content type) is admitted or refused from its path and headers alone,
before its body is read and before Connect's content-type and timeout checks. Every other route keeps
its own rule (docs/callers.md#who-may-call); the legacy API's paths are not covered."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.calls import METHODS, SERVICE_NAME
from app.api.connect import error_response
from app.auth.authenticator import Authenticator
from app.auth.rejections import Rejection

PREFIX = f"/{SERVICE_NAME}/"
AUTHORIZATION = b"authorization"
RPC_NAMES = {method.path: name for name, method in METHODS.items()}


class ConnectAuth:
    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app, self.authenticator = app, authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        values = [value for name, value in scope["headers"] if name.lower() == AUTHORIZATION]
        rpc = RPC_NAMES.get(scope["path"], "an unknown method")
        verdict = self.authenticator.admit(values, rpc, "Connect")
        if isinstance(verdict, Rejection):
            await error_response(verdict.error())(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = verdict
        await self.app(scope, receive, send)
