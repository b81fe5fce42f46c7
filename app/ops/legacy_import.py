"""`xmtp-push legacy import --from URL [--dry-run]`: the Go server's database added to ours
(docs/legacy.md#importing-the-go-servers-data).

The edge of the import: it reads the Go database in batches (app.legacy.go_import) and commits
each batch to ours (app.legacy.importing adds and counts), so memory stays bounded and an
interrupted run keeps what it committed (running it again adds the rest). A dry run commits
nothing. What it prints is counts only: never an id, a token, a topic, a key or the URL.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.core.database import create_engine, create_session_factory
from app.legacy import importing
from app.legacy.go_import import open_go_database
from app.legacy.importing import ImportReport, Tally

Batch = TypeVar("Batch")


async def import_go_database(settings: Settings, source: str, *, dry_run: bool) -> tuple[ImportReport, bool]:
    """What was (or, dry, would be) imported, and whether the Go database's topics were binary."""
    now_ns = time.time_ns()
    report = ImportReport()
    write = not dry_run
    engine = create_engine(settings)
    sessions = create_session_factory(engine)
    try:
        async with open_go_database(source, settings.database_connect_timeout_seconds) as go:
            add_installations = partial(
                importing.add_installations, now_ns=now_ns, tally=report.installations, write=write
            )
            add_subscriptions = partial(
                importing.add_subscriptions,
                now_ns=now_ns,
                report=report,
                max_active=settings.max_push_topics,
                write=write,
            )
            add_keys = partial(importing.add_keys, report=report, write=write)
            await _each_batch(go.installations(), sessions, add_installations, write)
            await _each_batch(go.subscriptions(), sessions, add_subscriptions, write)
            await _each_batch(go.keys(), sessions, add_keys, write)
            return report, go.schema.binary_topics
    finally:
        await engine.dispose()


async def _each_batch(
    batches: AsyncIterator[Batch],
    sessions: async_sessionmaker[AsyncSession],
    add: Callable[[AsyncSession, Batch], Awaitable[None]],
    write: bool,
) -> None:
    async for batch in batches:
        async with sessions() as session:
            await add(session, batch)
            if write:
                await session.commit()


def format_report(report: ImportReport, binary_topics: bool, *, dry_run: bool, ttl_seconds: int) -> str:
    generation = "binary (2026 and later)" if binary_topics else "strings (before 2026)"
    lines = [f"the Go server's database: topics stored as {generation}"]
    if dry_run:
        lines.append("dry run: nothing was written; an import now would add:")
    lines.append(_line("installations", report.installations))
    lines.append(_line("subscriptions", report.subscriptions))
    lines.append(_line("HMAC keys", report.keys))
    if report.installations.imported and not dry_run:
        lines.append(
            f"imported installations expire in {ttl_seconds} s (XMTP_PUSH_LEGACY_INSTALLATION_TTL_SECONDS) "
            "unless their app registers again"
        )
    return "\n".join(lines)


def _line(name: str, tally: Tally) -> str:
    of_which = ", ".join(f"{n} {what}" for what, n in tally.of_which.items() if n)
    imported = f"{tally.imported} imported" + (f" ({of_which})" if of_which else "")
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(tally.skipped.items()) if n)
    return f"{name}: {imported}" + (f"; skipped: {skipped}" if skipped else "")
