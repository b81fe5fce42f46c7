"""The long-lived parts of a process, made once at start-up and passed down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.core.database import create_engine, create_session_factory
from app.core.probes import Check, Probes
from app.delivery.registry import ProviderRegistry, default_apps
from app.queue.activity import ActivityLog, MemoryActivityLog, RedisActivityLog
from app.queue.backlog import sample_backlog
from app.queue.base import ENVELOPES, WorkQueue, delivery_stream
from app.queue.memory import MemoryQueue
from app.queue.redis_streams import RedisQueue
from app.recipients.service import RecipientRules
from app.recipients.types import Channel

# Every stream of the queue: envelopes to fan out, then one per XMTP channel.
STREAMS = (ENVELOPES, *(delivery_stream(c.label) for c in Channel if c is not Channel.UNSPECIFIED))


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    # For work that only reads, one statement at a time (fan-out pages, delivery targets): no
    # transaction, so no BEGIN and ROLLBACK round trips around each query.
    reads: async_sessionmaker[AsyncSession]
    rules: RecipientRules
    # Redis when configured; the in-process queue only where the caller allows it (dev).
    queue: WorkQueue | None = None
    # Recent outcomes and listener lag for stats and /status (beside the queue).
    activity: ActivityLog | None = None
    # Every configured (channel, app): empty in a process that sends nothing.
    providers: ProviderRegistry = field(default_factory=ProviderRegistry)

    async def queue_ready(self) -> bool:
        return self.queue is None or await self.queue.ping()

    async def database_ready(self) -> bool:
        try:
            async with self.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    async def providers_ready(self) -> bool:
        """Every channel the settings configure has its provider built."""
        built = {(p.channel, p.app) for p in self.providers}
        return all((a.channel, a.app) in built for a in default_apps(self.settings))

    async def sample_gauges(self) -> None:
        """The gauges read just before a scrape: the providers' state, and the backlog from the queue."""
        self.providers.sample_gauges()
        if self.queue is not None:
            await sample_backlog(self.queue, STREAMS)

    def probes(self, *checks: str) -> Probes:
        """Readiness by the named checks (`database`, `redis`, `providers`); `redis` only with Redis."""
        known: dict[str, Check] = {
            "database": self.database_ready,
            "redis": self.queue_ready,
            "providers": self.providers_ready,
        }
        names = [name for name in checks if name != "redis" or self.settings.redis_url]
        return Probes({name: known[name] for name in names}, self.sample_gauges)


def _open_queue(settings: Settings, in_process_queue: bool) -> tuple[WorkQueue | None, ActivityLog | None]:
    if settings.redis_url:
        queue = RedisQueue.from_url(settings.redis_url, settings.queue_reclaim_seconds)
        return queue, RedisActivityLog(queue.redis)
    if in_process_queue:
        return MemoryQueue(settings.queue_reclaim_seconds), MemoryActivityLog()
    return None, None


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, in_process_queue: bool = False, sends: bool = True
) -> AsyncIterator[Runtime]:
    """The process's long-lived parts; `sends`: with the providers of every configured channel."""
    engine = create_engine(settings)
    queue, activity = _open_queue(settings, in_process_queue)
    providers = ProviderRegistry()
    try:
        if sends:
            providers = ProviderRegistry.build(default_apps(settings), settings.http_timeout_seconds)
        yield Runtime(
            settings=settings,
            engine=engine,
            sessions=create_session_factory(engine),
            reads=create_session_factory(engine.execution_options(isolation_level="AUTOCOMMIT")),
            rules=RecipientRules.from_settings(settings),
            queue=queue,
            activity=activity,
            providers=providers,
        )
    finally:
        await providers.close()
        if queue is not None:
            await queue.close()
        await engine.dispose()
