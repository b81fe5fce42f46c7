"""`xmtp-push config check`: configuration, credentials and dependencies, without serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from alembic.runtime.migration import MigrationContext
from redis.asyncio import Redis
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.jwks import FetchFailed, fetch_key_set, jwks_host
from app.auth.key_source import JWKS_URL
from app.core.config import ENV_PREFIX, Settings, SettingsError
from app.core.migrations import head_revision
from app.delivery.registry import CHANNELS, FLAT_CHANNELS, DefaultApp, ways_to_configure
from app.delivery.url_policy import UrlPolicy
from app.marmot.dispatch import MARMOT_CHANNELS
from app.marmot.keys import InvalidServerKey, ServerKey
from app.marmot.startup import start_problems
from app.matrix.config import load_gateway_config
from app.ops.failures import (
    AUTH_KEYS_UNAVAILABLE,
    CHECK_FAILED,
    DATABASE_NOT_MIGRATED,
    DATABASE_READ_URL,
    DATABASE_UNREACHABLE,
    DATABASE_URL,
    INVALID_CONFIGURATION,
    REDIS_UNREACHABLE,
    REDIS_URL,
    Failure,
    classify,
    classify_replica,
)
from app.ops.roles import REQUIRED, REQUIRED_ONE_OF, SENDING_ROLES, XMTP_ROLES, needs_one_of
from app.quotas.quotas import unlimited_callers_warning
from app.runtime import Runtime, open_runtime

CHECK_SECONDS = 10.0
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str  # never a secret, URL or token
    exit_code: int = 0  # a failed check's code (app/ops/failures.py)


def _default_app_check(name: str, default: DefaultApp[Any], settings: Settings) -> Check:
    """A channel's default app: its credentials loaded when its settings configure it."""
    try:
        default.refuse_half_set(settings)
        return Check(name, True, "configured" if default.load(settings) is not None else "not configured")
    except SettingsError as error:
        return Check(name, False, str(error), INVALID_CONFIGURATION)


NO_CHANNEL = f"none configured, so every Register is refused: set {ways_to_configure(FLAT_CHANNELS)}"


def channel_warnings(settings: Settings) -> list[Check]:
    """Usable, but probably not meant: no channel at all."""
    if any(default.configured(settings) for default in FLAT_CHANNELS.values()):
        return []
    return [Check("channels", True, NO_CHANNEL)]


def matrix_check(path: str, settings: Settings) -> Check:
    """The Matrix gateway's apps (XMTP_PUSH_MATRIX_APPS), credentials loaded; only when set."""
    try:
        config = load_gateway_config(path, UrlPolicy.from_settings(settings))
    except SettingsError as error:
        return Check("matrix apps", False, str(error), INVALID_CONFIGURATION)
    types = sorted({app.type for app in config.apps.apps})
    return Check("matrix apps", True, f"{len(config.apps.apps)} app(s): {', '.join(types)}")


def marmot_check(settings: Settings) -> Check:
    """The Marmot notification server's settings: its key (parsed, never shown), how many relays, and
    which channels its pushes can use. A key set without relays or without a channel is a failure:
    `xmtp-push marmot` would refuse to start."""
    relays = f"{len(settings.marmot_relays)} relay(s)"
    if settings.marmot_secret_key is None or not settings.marmot_configured:
        return Check("marmot", True, f"not configured (XMTP_PUSH_MARMOT_SECRET_KEY not set), {relays}")
    try:
        ServerKey.parse(settings.marmot_secret_key.get_secret_value())
    except InvalidServerKey as error:
        return Check("marmot", False, f"XMTP_PUSH_MARMOT_SECRET_KEY: {error}", INVALID_CONFIGURATION)
    channels = [
        c for c in MARMOT_CHANNELS if (default := FLAT_CHANNELS.get(c)) and default.configured(settings)
    ]
    pushes = f"pushes through {', '.join(channels)}" if channels else "pushes through no channel"
    detail = f"key set, {relays}, {pushes}"
    if not settings.marmot_relays:
        return Check("marmot", False, f"{detail}: XMTP_PUSH_MARMOT_RELAYS is required", INVALID_CONFIGURATION)
    if not channels:
        wanted = " or ".join(CHANNELS[c].label for c in MARMOT_CHANNELS)
        return Check("marmot", False, f"{detail}: configure {wanted}", INVALID_CONFIGURATION)
    if problems := start_problems(settings):  # what `xmtp-push marmot` refuses at start
        return Check("marmot", False, f"{detail}: {'; '.join(problems)}", INVALID_CONFIGURATION)
    return Check("marmot", True, detail)


async def _bounded(
    name: str,
    probe: Awaitable[Check],
    unanswered: Failure,
    classified: Callable[[BaseException], Failure | None] = classify,
) -> Check:
    try:
        return await asyncio.wait_for(probe, CHECK_SECONDS)
    except TimeoutError:
        return Check(name, False, unanswered.message, unanswered.code)
    except Exception as error:
        failure = classified(error)
        if failure is None:
            return Check(name, False, f"failed ({type(error).__name__})", CHECK_FAILED)
        return Check(name, False, failure.message, failure.code)


async def _database(runtime: Runtime) -> Check:
    head = _head(runtime)
    async with runtime.engine.connect() as connection:
        current = await connection.run_sync(_current_revision)
    if current != head:
        detail = f"{DATABASE_URL}: schema at {current or 'none'}, expected {head}: run `xmtp-push migrate`"
        return Check("database", False, detail, DATABASE_NOT_MIGRATED)
    return Check("database", True, f"reachable, schema at {head}")


async def _replica(runtime: Runtime, replica: AsyncEngine) -> Check:
    """The read replica: reachable, at the primary's schema (it replicates it), and whether it is
    in recovery (a streaming replica) or a primary of its own."""
    head = _head(runtime)
    async with replica.connect() as connection:
        current = await connection.run_sync(_current_revision)
        in_recovery = (await connection.execute(text("SELECT pg_is_in_recovery()"))).scalar()
    if current != head:
        detail = f"{DATABASE_READ_URL}: schema at {current or 'none'}, expected {head}: is it a replica of {DATABASE_URL}?"
        return Check("replica", False, detail, DATABASE_NOT_MIGRATED)
    role = "in recovery (a replica)" if in_recovery else "not in recovery (a primary, not a replica)"
    return Check("replica", True, f"reachable, {role}, schema at {head}")


def _head(runtime: Runtime) -> str | None:
    return head_revision(runtime.settings)


def _current_revision(connection: Connection) -> str | None:
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)  # a check, not a migration
    return MigrationContext.configure(connection).get_current_revision()


async def _redis(url: str) -> Check:
    # A client of its own, so that what the connection met (refused, credentials, ...) is told.
    client = Redis.from_url(url, socket_connect_timeout=CHECK_SECONDS)
    try:
        await client.ping()
    finally:
        await client.aclose()
    return Check("redis", True, "reachable")


async def dependency_checks(runtime: Runtime, *, replica: bool = False) -> list[Check]:
    """The database (answering, migrated), the read replica (`replica`: when configured; a serving
    process tells it apart: workers/server.py) and Redis (when configured), each within CHECK_SECONDS."""
    silent = f"no answer within {CHECK_SECONDS:.0f} s"
    database = Failure(DATABASE_UNREACHABLE, f"{DATABASE_URL}: the database gave {silent}")
    checks = [await _bounded("database", _database(runtime), database)]
    if replica and runtime.replica is not None:
        silent_replica = Failure(DATABASE_UNREACHABLE, f"{DATABASE_READ_URL}: the read replica gave {silent}")
        checks.append(
            await _bounded("replica", _replica(runtime, runtime.replica), silent_replica, classify_replica)
        )
    if runtime.settings.redis_url:
        checks.append(await _redis_check(runtime.settings.redis_url))
    return checks


async def _redis_check(url: str) -> Check:
    silent = Failure(REDIS_UNREACHABLE, f"{REDIS_URL}: Redis gave no answer within {CHECK_SECONDS:.0f} s")
    return await _bounded("redis", _redis(url), silent)


async def check_dependencies_at_start(runtime: Runtime) -> None:
    """A serving command's start-up: one line saying the database and Redis answer, or one for each
    that does not. Serving goes on: the calls needing it answer UNAVAILABLE until it serves."""
    checks = await dependency_checks(runtime)
    for check in checks:
        if not check.ok:
            consequence = "serving anyway: what needs it answers UNAVAILABLE until it serves"
            runtime.dependencies.down(check.name, check.exit_code, check.detail, consequence)
    if answering := [f"{check.name} {check.detail}" for check in checks if check.ok]:
        log.info("start-up check: %s", "; ".join(answering))


def present_roles(settings: Settings) -> tuple[str, ...]:
    """The roles whose settings are present, checked when no `--role` is given: the gateway's and
    Marmot's by their own settings; the XMTP ones unless the settings are only those (a gateway or
    Marmot deployment sets no XMTP_PUSH_DATABASE_URL): `dev` without Redis, `api` and `worker`
    with it, and `listen` with an xmtpd or a node-go node."""
    roles = [role for role in ("gateway", "marmot") if settings.all_set(REQUIRED[role])]
    if not roles or "database_url" in settings.model_fields_set:
        xmtp = ("api", "worker") if settings.redis_url else ("dev",)
        listens = settings.xmtpd_address or settings.node_go_address
        roles[:0] = xmtp + (("listen",) if listens else ())
    return tuple(roles)


def _required_checks(settings: Settings, roles: tuple[str, ...]) -> list[Check]:
    checks = []
    for role in roles:
        for name in REQUIRED.get(role, ()):
            if not settings.all_set((name,)):
                detail = f"{ENV_PREFIX}{name.upper()}: required by `{role}`"
                checks.append(Check(role, False, detail, INVALID_CONFIGURATION))
        one_of = REQUIRED_ONE_OF.get(role, ())
        if one_of and not any(settings.all_set((name,)) for name in one_of):
            checks.append(Check(role, False, needs_one_of(role), INVALID_CONFIGURATION))
    return checks


def _setting_checks(settings: Settings, roles: tuple[str, ...]) -> list[Check]:
    """The settings and credentials the roles use: every channel for a role that sends (not
    `listen`), APNs and FCM and Marmot's own for `marmot`, the Matrix apps for the gateway (and for `dev` and `api`, which serve it when set)."""
    sending = any(role in SENDING_ROLES for role in roles)
    channels = (
        FLAT_CHANNELS if sending else {c: FLAT_CHANNELS[c] for c in MARMOT_CHANNELS if "marmot" in roles}
    )
    checks = [_default_app_check(f"channel {c}", default, settings) for c, default in channels.items()]
    if settings.matrix_apps and {"dev", "api", "gateway"} & set(roles):
        checks.append(matrix_check(settings.matrix_apps, settings))
    if {"dev", "marmot"} & set(roles):
        checks.append(marmot_check(settings))
    return checks


async def auth_check(settings: Settings) -> Check:
    """Caller authentication's keys: the JWKS fetched once (its settings were checked on loading)."""
    keys = len(settings.auth_api_keys or ())
    if not settings.auth_jwks_url:
        inline = len(settings.auth_keys or ())
        return Check("auth", True, f"on ({keys} API keys; {inline} inline JWT keys)")
    host = jwks_host(settings.auth_jwks_url)
    try:
        found = await fetch_key_set(settings.auth_jwks_url)
    except FetchFailed as error:
        detail = f"{JWKS_URL}: no usable key set from {host} ({error})"
        return Check("auth", False, detail, AUTH_KEYS_UNAVAILABLE)
    return Check("auth", True, f"on ({keys} API keys; JWT keys: {len(found)} from {host})")


async def run_checks(settings: Settings, roles: tuple[str, ...] = ()) -> list[Check]:
    """What `roles` need (the present ones when none is named), and nothing else."""
    roles = roles or present_roles(settings)
    checks = _required_checks(settings, roles) + _setting_checks(settings, roles)
    if {"dev", "api"} & set(roles) and (warning := unlimited_callers_warning(settings)):
        log.warning("%s", warning)
    if settings.auth_enabled and {"dev", "api"} & set(roles):
        checks.append(await auth_check(settings))
    if any(role in XMTP_ROLES for role in roles):
        async with open_runtime(settings, sends=False) as runtime:
            checks += await dependency_checks(runtime, replica=True)
    elif settings.redis_url:
        checks.append(await _redis_check(settings.redis_url))
    return checks
