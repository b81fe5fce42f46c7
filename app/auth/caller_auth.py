"""Caller authentication as a process runs it: off (None), or an authenticator over the API keys and
the JWT keys (inline, or a JWKS loaded before the ports are bound and refreshed beside the servers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from app.auth.authenticator import Authenticator
from app.auth.key_source import JwksKeys
from app.auth.keys import KeySet
from app.core.config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallerAuth:
    authenticator: Authenticator
    jwks: JwksKeys | None  # None: no key set to refresh (API keys or inline keys only)


@contextlib.asynccontextmanager
async def opened_caller_auth(settings: Settings) -> AsyncIterator[CallerAuth | None]:
    """While the block runs, the process's caller authentication (None while XMTP_PUSH_AUTH_ENABLED is
    false: nothing is loaded, fetched or read)."""
    if not settings.auth_enabled:
        yield None
        return
    jwks, jwt_keys, described = await _jwt_keys(settings)
    keys = len(settings.auth_api_keys or ())
    parts = ([f"{keys} API key{'s' if keys != 1 else ''}"] if keys else []) + (
        [described] if described else []
    )
    log.info("auth: on (%s)", "; ".join(parts))
    if settings.legacy_api_enabled:
        # The legacy API's SDK clients cannot send a credential: it stays open, as the Go server's was.
        log.warning(
            "XMTP_PUSH_AUTH_ENABLED does not cover the legacy notifications.v1 API "
            "(XMTP_PUSH_LEGACY_API_ENABLED): its callers send no credentials"
        )
    stop = asyncio.Event()
    refresh = asyncio.create_task(jwks.run(stop)) if jwks else None
    try:
        yield CallerAuth(Authenticator.from_settings(settings, jwt_keys), jwks)
    finally:
        stop.set()
        if refresh is not None:
            await asyncio.gather(refresh, return_exceptions=True)


async def _jwt_keys(settings: Settings) -> tuple[JwksKeys | None, Callable[[], KeySet] | None, str]:
    if settings.auth_jwks_url:
        jwks = JwksKeys(
            settings.auth_jwks_url, settings.auth_jwks_refresh_seconds, settings.auth_jwks_max_stale_seconds
        )
        await jwks.load_at_start()
        return jwks, lambda: jwks.current, f"JWT keys: {len(jwks.current)} from {jwks.host}"
    if settings.auth_keys:
        inline = KeySet.inline(settings.auth_keys)
        return None, lambda: inline, f"JWT keys: {len(inline)} inline"
    return None, None, ""
