"""Adding what the Go server's database holds (docs/legacy.md#importing-the-go-servers-data), one
batch at a time, and counting what was imported and what was skipped and why.

The rule: what is here wins. An installation, a subscription or a period's key that xmtp-push
already holds (stored by its API since the switch, or by an earlier import) is never changed; the
import adds only what is missing, so a second run adds nothing and nothing newer is replaced. Each
function runs inside the caller's transaction and only flushes; with `write` false (a dry run) it
counts and writes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app.legacy import repository as repo
from app.legacy.commands import ImportedInstallation, ImportedKey, ImportedSubscription

ALREADY_HERE = "already here"
DELETED = "deleted"
WITHOUT_MECHANISM = "without a delivery mechanism"
INACTIVE = "inactive"
SILENT = "silent"
OVER_TOPIC_LIMIT = "active beyond XMTP_PUSH_MAX_PUSH_TOPICS for its installation"
OF_A_SUBSCRIPTION_OVER_THE_LIMIT = "of a subscription beyond XMTP_PUSH_MAX_PUSH_TOPICS"
Row = TypeVar("Row", ImportedInstallation, ImportedSubscription, ImportedKey)
Identity = TypeVar("Identity", bound=Hashable)


@dataclass(slots=True)
class Tally:
    """One table's counts: imported, how many of those are of each kind, and skipped by reason."""

    imported: int = 0
    of_which: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class ImportReport:
    installations: Tally = field(default_factory=Tally)
    subscriptions: Tally = field(default_factory=Tally)
    keys: Tally = field(default_factory=Tally)
    # Active subscriptions by installation: held before the import, and imported since (an entry per
    # installation given an active subscription, kept for the run: its rows come in any order).
    active: Counter[str] = field(default_factory=Counter)
    # The subscriptions left out for the topic limit, whose keys are left out too.
    over_limit: set[tuple[str, str]] = field(default_factory=set)


async def add_installations(
    session: AsyncSession,
    batch: Sequence[ImportedInstallation | str],
    now_ns: int,
    tally: Tally,
    *,
    write: bool,
) -> None:
    new = await _missing(batch, tally, lambda r: r.installation_id, repo.existing_installations, session)
    tally.of_which[DELETED] += sum(1 for r in new if r.deleted)
    tally.of_which[WITHOUT_MECHANISM] += sum(1 for r in new if r.mechanism is None)
    if write and new:
        await repo.add_installations(session, new, now_ns)
        await session.flush()


async def add_subscriptions(
    session: AsyncSession,
    batch: Sequence[ImportedSubscription | str],
    now_ns: int,
    report: ImportReport,
    *,
    max_active: int,
    write: bool,
) -> None:
    """Each subscription missing here, but no more active ones per installation than the API lets
    it hold (XMTP_PUSH_MAX_PUSH_TOPICS): the first read are kept."""
    tally = report.subscriptions
    found = await _missing(
        batch, tally, lambda r: (r.installation_id, r.topic), repo.existing_subscriptions, session
    )
    new = await _within_topic_limit(session, found, now_ns, report, max_active)
    tally.of_which[INACTIVE] += sum(1 for r in new if not r.active)
    tally.of_which[SILENT] += sum(1 for r in new if r.is_silent)
    if write and new:
        await repo.add_subscriptions(session, new, now_ns)
        await session.flush()


async def _within_topic_limit(
    session: AsyncSession,
    rows: list[ImportedSubscription],
    now_ns: int,
    report: ImportReport,
    max_active: int,
) -> list[ImportedSubscription]:
    active = report.active
    first_seen = {r.installation_id for r in rows if r.active and r.installation_id not in active}
    if first_seen:  # what each held before this run (its rows are made at now_ns)
        held = await repo.active_counts(session, list(first_seen), now_ns)
        for installation_id in first_seen:
            active[installation_id] = held.get(installation_id, 0)
    kept = []
    for row in rows:
        if row.active and active[row.installation_id] >= max_active:
            report.over_limit.add((row.installation_id, row.topic))
            continue
        if row.active:
            active[row.installation_id] += 1
        kept.append(row)
    report.subscriptions.imported -= len(rows) - len(kept)
    report.subscriptions.skipped[OVER_TOPIC_LIMIT] += len(rows) - len(kept)
    return kept


async def add_keys(
    session: AsyncSession, batch: Sequence[ImportedKey | str], report: ImportReport, *, write: bool
) -> None:
    over = report.over_limit
    if over:
        batch = [
            OF_A_SUBSCRIPTION_OVER_THE_LIMIT
            if not isinstance(r, str) and (r.installation_id, r.topic) in over
            else r
            for r in batch
        ]
    new = await _missing(
        batch, report.keys, lambda r: (r.installation_id, r.topic, r.period), repo.existing_keys, session
    )
    if write and new:
        await repo.add_keys(session, new)
        await session.flush()


async def _missing(
    batch: Sequence[Row | str],
    tally: Tally,
    identity: Callable[[Row], Identity],
    existing: Callable[[AsyncSession, list[Identity]], Awaitable[set[Identity]]],
    session: AsyncSession,
) -> list[Row]:
    """The rows of `batch` not stored yet, counted as imported; the others counted as skipped
    (a string in the batch is the reason its row was skipped when read)."""
    rows: list[Row] = []
    for item in batch:
        if isinstance(item, str):
            tally.skipped[item] += 1
        else:
            rows.append(item)
    here = await existing(session, [identity(r) for r in rows]) if rows else set()
    new = [r for r in rows if identity(r) not in here]
    tally.skipped[ALREADY_HERE] += len(rows) - len(new)
    tally.imported += len(new)
    return new
