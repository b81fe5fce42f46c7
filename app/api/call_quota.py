"""A call's quotas and its caller, as each transport knows them (docs/callers.md#the-caller): the
principal its credential was admitted as, else its peer's address, or the address a trusted proxy
forwarded it for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from fastapi import Request

from app.api.auth_grpc import ADMITTED
from app.api.calls import CallQuota
from app.auth.authenticator import Principal
from app.core.quota_settings import Network
from app.quotas.callers import caller_by_address, grpc_peer_host
from app.quotas.quotas import Quotas

FORWARDED_FOR = "x-forwarded-for"


def _caller(
    principal: Any, peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]
) -> str:
    if isinstance(principal, Principal):
        return principal.identity()
    return caller_by_address(peer, forwarded_for, trusted)


def connect_quota(request: Request, quotas: Quotas | None) -> CallQuota | None:
    if quotas is None:
        return None
    trusted = request.app.state.runtime.settings.trusted_proxies

    def caller() -> str:
        principal = request.scope.get("state", {}).get("principal")
        peer = request.client.host if request.client else None
        forwarded = request.headers.getlist(FORWARDED_FOR) if trusted else []
        return _caller(principal, peer, forwarded, trusted)

    return CallQuota(quotas, caller)


def grpc_quota(
    context: grpc.aio.ServicerContext[Any, Any], quotas: Quotas | None, trusted: Sequence[Network]
) -> CallQuota | None:
    if quotas is None:
        return None
    principal = ADMITTED.get()  # read now: this task's, set by the guard before the handler

    def caller() -> str:
        forwarded = [
            value if isinstance(value, str) else value.decode("latin-1")
            for key, value in context.invocation_metadata() or ()
            if trusted and key.lower() == FORWARDED_FOR
        ]
        return _caller(principal, grpc_peer_host(context.peer()), forwarded, trusted)

    return CallQuota(quotas, caller)
