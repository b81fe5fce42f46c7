"""Deletes recipients and legacy installations past their TTL, with their subscriptions, on a fixed interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.legacy import service as legacy_service
from app.ops.failures import tell_or_log
from app.recipients import service
from app.runtime import Runtime

log = logging.getLogger(__name__)


async def sweep_once(runtime: Runtime) -> int:
    """Delete every expired recipient, one committed batch at a time, then every expired legacy
    installation likewise; returns how many recipients."""
    total = 0
    while True:
        async with runtime.sessions() as session, session.begin():
            deleted = await service.sweep_expired(session, runtime.rules)
        total += deleted
        if deleted < service.SWEEP_BATCH:
            break
    more = True
    while more:
        async with runtime.sessions() as session, session.begin():
            more = await legacy_service.sweep_expired(session, runtime.legacy_rules, service.SWEEP_BATCH)
    return total


async def run_sweeper(runtime: Runtime, stop: asyncio.Event) -> None:
    """Sweep now and then every sweep_interval_seconds until `stop` is set. Told, not cancelled:
    a cancellation landing inside a database call can come out as an ordinary error (or not at
    all, on Python 3.11's wait_for), and the loop below would carry on."""
    while not stop.is_set():
        try:
            deleted = await sweep_once(runtime)
            runtime.dependencies.up("database")
            if deleted:
                log.info("expired recipients deleted", extra={"count": deleted})
        except Exception as error:
            bug = "expiry sweep failed; retrying at the next interval"
            tell_or_log(error, runtime.dependencies, "the expiry sweep waits for it", log, bug)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), runtime.settings.sweep_interval_seconds)
