"""The JWKS key set: loaded before the ports are bound, refreshed in the background (never while a
call waits), and given up when too stale (docs/callers.md#key-set).

A successful fetch replaces the whole set; a failed one keeps the last, with one WARNING when fetches
start failing and one INFO when one succeeds again. `max_stale_seconds` after the last success the set
expires: the callbacks run (readiness and gRPC health turn unready) and `expired` is set, upon which
the process stops taking calls and exits 10. A fetch that lands after the deadline does not save it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from app.auth.jwks import FetchFailed, fetch_key_set, jwks_host
from app.auth.keys import KeySet
from app.core.config import ENV_PREFIX

JWKS_URL = f"{ENV_PREFIX}AUTH_JWKS_URL"
START_TRIES = 3
START_PAUSE_SECONDS = 1.0
JITTER = 0.1  # a refresh waits its period plus up to a tenth of it, so replicas spread their fetches
log = logging.getLogger(__name__)


class KeysUnavailable(Exception):
    """No usable key set at start-up, or none fetched for too long: one line naming the setting and at
    most the JWKS host; the process exits 10."""


class JwksKeys:
    def __init__(self, url: str, refresh_seconds: float, max_stale_seconds: float) -> None:
        self.url, self.host = url, jwks_host(url)
        self.refresh_seconds, self.max_stale_seconds = refresh_seconds, max_stale_seconds
        self.current = KeySet()
        self.expired = asyncio.Event()
        self._fetched_at = 0.0
        self._on_expiry: list[Callable[[], Awaitable[None]]] = []

    def on_expiry(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._on_expiry.append(callback)

    def fresh(self) -> bool:
        return not self.expired.is_set()

    async def fresh_check(self) -> bool:  # a readiness check
        return self.fresh()

    async def load_at_start(self, tries: int = START_TRIES, pause: float = START_PAUSE_SECONDS) -> None:
        why = ""
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(pause)
            try:
                self._replace(await fetch_key_set(self.url))
                return
            except FetchFailed as error:
                why = str(error)
        raise KeysUnavailable(f"{JWKS_URL}: no usable key set from {self.host} after {tries} tries ({why})")

    def _replace(self, keys: KeySet) -> None:
        self.current, self._fetched_at = keys, time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until `stop`, or until the set expires."""
        failing = False
        while not self.expired.is_set():
            deadline = self._fetched_at + self.max_stale_seconds
            period = self.refresh_seconds * (1 + random.uniform(0, JITTER))
            if await _stopped(stop, min(period, deadline - time.monotonic())):
                return
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                    keys = await fetch_key_set(self.url)
            except (FetchFailed, TimeoutError) as error:
                if time.monotonic() >= deadline:
                    await self._expire()
                elif not failing:
                    failing = True
                    log.warning(
                        "auth: JWKS fetch from %s failed (%s); keeping the last key set", self.host, error
                    )
                continue
            self._replace(keys)
            if failing:
                failing = False
                log.info("auth: JWKS fetch from %s succeeds again (%d keys)", self.host, len(keys))

    async def _expire(self) -> None:
        log.error(
            "auth: no key set fetched from %s for %g s: not ready, stopping",
            self.host,
            self.max_stale_seconds,
        )
        for callback in self._on_expiry:
            with contextlib.suppress(Exception):
                await callback()
        self.expired.set()

    def expiry_error(self) -> KeysUnavailable:
        return KeysUnavailable(
            f"{JWKS_URL}: no key set fetched from {self.host} for {self.max_stale_seconds:g} s "
            f"({ENV_PREFIX}AUTH_JWKS_MAX_STALE_SECONDS)"
        )


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Waits `seconds` or until `stop`; whether `stop` came."""
    if seconds <= 0:
        return stop.is_set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()
