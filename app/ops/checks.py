"""`xmtp-push config check`: configuration, credentials and dependencies, without serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from app.core.config import Settings, SettingsError
from app.core.migrations import alembic_config
from app.delivery.credentials import apns_credentials, fcm_credentials
from app.runtime import Runtime, open_runtime

CHECK_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str  # never a secret, URL or token


def channel_checks(settings: Settings) -> list[Check]:
    checks = []
    for name, load in (("channel apns", apns_credentials), ("channel fcm", fcm_credentials)):
        try:
            checks.append(Check(name, True, "configured" if load(settings) else "not configured"))
        except SettingsError as error:
            checks.append(Check(name, False, str(error)))
    checks.append(Check("channel http", True, "configured" if settings.http_enabled else "not configured"))
    return checks


async def _bounded(name: str, probe: Awaitable[Check]) -> Check:
    try:
        return await asyncio.wait_for(probe, CHECK_SECONDS)
    except TimeoutError:
        return Check(name, False, f"no answer within {CHECK_SECONDS:.0f} s")
    except Exception as error:
        return Check(name, False, f"unreachable ({type(error).__name__})")


async def _database(runtime: Runtime) -> Check:
    head = ScriptDirectory.from_config(alembic_config(runtime.settings.database_url)).get_current_head()
    async with runtime.engine.connect() as connection:
        current = await connection.run_sync(_current_revision)
    if current != head:
        return Check(
            "database", False, f"schema at {current or 'none'}, expected {head}: run `xmtp-push migrate`"
        )
    return Check("database", True, f"reachable, schema at {head}")


def _current_revision(connection: Connection) -> str | None:
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)  # a check, not a migration
    return MigrationContext.configure(connection).get_current_revision()


async def _redis(runtime: Runtime) -> Check:
    ok = runtime.queue is not None and await runtime.queue.ping()
    return Check("redis", ok, "reachable" if ok else "unreachable")


async def run_checks(settings: Settings) -> list[Check]:
    checks = channel_checks(settings)
    async with open_runtime(settings, sends=False) as runtime:
        checks.append(await _bounded("database", _database(runtime)))
        if settings.redis_url:
            checks.append(await _bounded("redis", _redis(runtime)))
    return checks
