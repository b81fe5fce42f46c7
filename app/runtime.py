"""The long-lived parts of a process, made once at start-up and passed down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.core import metrics
from app.core.channels import Channel
from app.core.config import ENV_PREFIX, Settings
from app.core.database import create_engine, create_read_engine, create_session_factory
from app.core.dependencies import DependencyLog
from app.core.probes import Check, Probes
from app.delivery.egress import EgressProxy
from app.delivery.registry import ChannelApp, ProviderRegistry, default_apps
from app.delivery.url_policy import UrlPolicy
from app.legacy.deliveries import legacy_apps
from app.legacy.jobs import LEGACY_ENVELOPES, legacy_delivery_stream
from app.legacy.service import LegacyRules
from app.matrix.config import GatewayConfig, HttpSection, load_gateway_config
from app.matrix.duplicates import DeliveredMemory, ProcessMemory, RedisMemory
from app.matrix.service import Gateway
from app.queue.activity import ActivityLog, MemoryActivityLog, RedisActivityLog
from app.queue.backlog import sample_backlog
from app.queue.base import ENVELOPES, WorkQueue, delivery_stream
from app.queue.memory import MemoryQueue
from app.queue.redis_streams import RedisQueue
from app.recipients.service import RecipientRules
from app.recipients.types import DELIVERY_CHANNELS

# A scrape waits this long at most for each service to answer.
DEPENDENCY_CHECK_SECONDS = 1.0
# Every stream of the queue: the new API's, then the legacy source's (app.legacy.jobs).
LEGACY_STREAMS = (
    LEGACY_ENVELOPES,
    *(legacy_delivery_stream(c) for c in (Channel.APNS, Channel.FCM, Channel.HTTP)),
)
STREAMS = (ENVELOPES, *(delivery_stream(c) for c in DELIVERY_CHANNELS.values()), *LEGACY_STREAMS)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    # For work that only reads, one statement at a time (fan-out pages, delivery targets): no
    # transaction, so no BEGIN and ROLLBACK round trips around each query. On the read replica
    # when XMTP_PUSH_DATABASE_READ_URL is set; every write, and every read inside one, uses `sessions`.
    reads: async_sessionmaker[AsyncSession]
    rules: RecipientRules
    # The legacy notifications.v1 API's rules (app.legacy.service).
    legacy_rules: LegacyRules
    # Redis when configured; the in-process queue only where the caller allows it (dev).
    queue: WorkQueue | None = None
    # Recent outcomes and listener lag for stats and /status (beside the queue).
    activity: ActivityLog | None = None
    # Every configured (channel, app): empty in a process that sends nothing.
    providers: ProviderRegistry = field(default_factory=ProviderRegistry)
    # The Matrix push gateway, when XMTP_PUSH_MATRIX_APPS names its apps.
    matrix: Gateway | None = None
    # The read replica's engine, behind `reads`, when XMTP_PUSH_DATABASE_READ_URL is set.
    replica: AsyncEngine | None = None
    # What the process last saw of the database and Redis: one log line per change of state.
    dependencies: DependencyLog = field(default_factory=DependencyLog)

    async def queue_ready(self) -> bool:
        return self.queue is None or await self.queue.ping()

    async def database_ready(self) -> bool:
        # SQLite on a full disk still answers reads: while the calls meet failing writes (they tell
        # `dependencies`, and a call that succeeds clears it) the process is not ready.
        if self.settings.is_sqlite and self.dependencies.is_down("database"):
            return False
        return await _answers(self.engine)

    async def replica_ready(self) -> bool:
        return self.replica is None or await _answers(self.replica)

    async def providers_ready(self) -> bool:
        """Every channel the settings configure has its provider built."""
        built = {(p.channel, p.app) for p in self.providers}
        return all((a.channel, a.app) in built for a in default_apps(self.settings))

    async def sample_gauges(self) -> None:
        """The gauges read just before a scrape: the providers' state, whether the database and Redis
        answer, and the backlog from the queue (left out when it cannot be read)."""
        self.providers.sample_gauges()
        services = {"database": self.database_ready}
        if isinstance(self.queue, RedisQueue):
            services["redis"] = self.queue_ready
        answers = await asyncio.gather(*(_answers_within(check) for check in services.values()))
        for name, answered in zip(services, answers, strict=True):
            metrics.dependency_up.labels(name).set(1 if answered else 0)
        if self.queue is not None:
            await sample_backlog(self.queue, STREAMS)

    def probes(self, *checks: str) -> Probes:
        """Readiness by the named checks (`database`, `replica`, `redis`, `providers`); `redis` only
        with Redis, `replica` only with a read replica."""
        known: dict[str, Check] = {
            "database": self.database_ready,
            "replica": self.replica_ready,
            "redis": self.queue_ready,
            "providers": self.providers_ready,
        }
        configured = {"redis": bool(self.settings.redis_url), "replica": self.replica is not None}
        names = [name for name in checks if configured.get(name, True)]
        return Probes({name: known[name] for name in names}, self.sample_gauges)


async def _answers_within(check: Callable[[], Awaitable[bool]]) -> bool:
    """Whether `check` says yes within a second (a scrape waits for it)."""
    try:
        return await asyncio.wait_for(check(), DEPENDENCY_CHECK_SECONDS)
    except Exception:
        return False


async def _answers(engine: AsyncEngine) -> bool:
    try:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception:
        return False
    return True


def _open_queue(settings: Settings, in_process_queue: bool) -> tuple[WorkQueue | None, ActivityLog | None]:
    if settings.redis_url:
        queue = RedisQueue.from_url(
            settings.redis_url,
            settings.queue_reclaim_seconds,
            settings.queue_partitions,
            settings.redis_cluster,
            settings.redis_max_connections,
        )
        return queue, RedisActivityLog(queue.link)
    if in_process_queue:
        return MemoryQueue(settings.queue_reclaim_seconds, settings.queue_partitions), MemoryActivityLog()
    return None, None


def load_matrix_apps(settings: Settings) -> GatewayConfig | None:
    """The gateway's apps, credentials loaded, its warnings said; SettingsError when unusable."""
    if not settings.matrix_apps:
        return None
    config = load_gateway_config(settings.matrix_apps, UrlPolicy.from_settings(settings))
    for warning in config.warnings:
        log.warning("%s", warning)
    return config


def _say_http_section_unused(config: GatewayConfig) -> None:
    if config.http != HttpSection():
        log.warning(
            "%sMATRIX_APPS: its http section is read by `xmtp-push gateway` only; this process "
            "listens on %sHTTP_HOST and %sHTTP_PORT",
            ENV_PREFIX,
            ENV_PREFIX,
            ENV_PREFIX,
        )


def _build_providers(
    settings: Settings, defaults: list[ChannelApp], matrix: GatewayConfig | None
) -> ProviderRegistry:
    """Every provider of the process: the flat settings' apps, and each gateway app's own (bounded
    by the gateway's request time, through its file's `proxy:` when it names one)."""
    proxy = EgressProxy.for_providers(settings)
    providers = list(ProviderRegistry.build(defaults, settings.provider_timeout_seconds, proxy))
    if matrix is not None:
        timeout = settings.matrix_request_timeout_seconds
        matrix_proxy = EgressProxy.for_providers(settings, matrix.proxy)
        providers += ProviderRegistry.build(matrix.apps.channel_apps(), timeout, matrix_proxy)
    return ProviderRegistry(providers)


@asynccontextmanager
async def open_gateway(
    settings: Settings, config: GatewayConfig, providers: ProviderRegistry
) -> AsyncIterator[Gateway]:
    """The gateway over its providers, with its memory of deliveries (Redis when configured)."""
    memory: DeliveredMemory = (
        RedisMemory.from_url(settings.redis_url, settings.redis_cluster, settings.redis_max_connections)
        if settings.redis_url
        else ProcessMemory()
    )
    gateway = Gateway(config.apps, providers, memory, settings.matrix_request_timeout_seconds)
    try:
        yield gateway
    finally:
        await gateway.close()
        await memory.close()


@asynccontextmanager
async def open_gateway_alone(settings: Settings, config: GatewayConfig) -> AsyncIterator[Gateway]:
    """`xmtp-push gateway`: the gateway's providers and memory for the apps of `config`, and no
    database or queue."""
    providers = _build_providers(settings, [], config)
    try:
        async with open_gateway(settings, config, providers) as gateway:
            yield gateway
    finally:
        await providers.close()


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, in_process_queue: bool = False, sends: bool = True, gateway: bool = False
) -> AsyncIterator[Runtime]:
    """The process's long-lived parts; `sends`: with the providers of every configured channel;
    `gateway`: with the Matrix gateway too, when XMTP_PUSH_MATRIX_APPS is set (HTTP processes)."""
    engine = create_engine(settings)
    replica = create_read_engine(settings)
    queue, activity = _open_queue(settings, in_process_queue)
    providers = ProviderRegistry()
    try:
        if isinstance(queue, RedisQueue):
            await queue.start()  # another partition count stops start-up here
        async with AsyncExitStack() as stack:
            matrix_gateway = None
            if sends:
                matrix = load_matrix_apps(settings) if gateway else None
                providers = _build_providers(settings, default_apps(settings) + legacy_apps(settings), matrix)
                if matrix is not None:
                    _say_http_section_unused(matrix)
                    matrix_gateway = await stack.enter_async_context(
                        open_gateway(settings, matrix, providers)
                    )
            yield Runtime(
                settings=settings,
                engine=engine,
                sessions=create_session_factory(engine),
                reads=create_session_factory(
                    (replica or engine).execution_options(isolation_level="AUTOCOMMIT")
                ),
                rules=RecipientRules.from_settings(settings),
                legacy_rules=LegacyRules.from_settings(settings),
                queue=queue,
                activity=activity,
                providers=providers,
                matrix=matrix_gateway,
                replica=replica,
            )
    finally:
        await providers.close()
        if queue is not None:
            await queue.close()
        await engine.dispose()
        if replica is not None:
            await replica.dispose()
