"""Deletes recipients past their TTL, with their subscriptions, on a fixed interval."""

from __future__ import annotations

import asyncio
import logging

from app.recipients import service
from app.runtime import Runtime

log = logging.getLogger(__name__)


async def sweep_once(runtime: Runtime) -> int:
    """Delete every expired recipient, one committed batch at a time; returns how many."""
    total = 0
    while True:
        async with runtime.sessions() as session, session.begin():
            deleted = await service.sweep_expired(session, runtime.rules)
        total += deleted
        if deleted < service.SWEEP_BATCH:
            return total


async def run_sweeper(runtime: Runtime) -> None:
    """Sweep now and then every sweep_interval_seconds until cancelled."""
    while True:
        try:
            deleted = await sweep_once(runtime)
            if deleted:
                log.info("expired recipients deleted", extra={"count": deleted})
        except Exception:
            log.exception("expiry sweep failed; retrying at the next interval")
        await asyncio.sleep(runtime.settings.sweep_interval_seconds)
