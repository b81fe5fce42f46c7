"""Every query on legacy installations, subscriptions and keys. Functions flush, never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy import Text, and_, any_, bindparam, delete, func, select, tuple_, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.database import fetch_rows, upsert_insert
from app.legacy.commands import (
    ImportedInstallation,
    ImportedKey,
    ImportedSubscription,
    Mechanism,
    SubscriptionSpec,
)
from app.legacy.eligibility import PERIOD_NS
from app.legacy.models import LegacyHmacKey, LegacyInstallation, LegacySubscription

Installation = LegacyInstallation
Sub = LegacySubscription
Key = LegacyHmacKey
# The periods whose keys a subscription keeps: an SDK sends this period's and its neighbours'.
KEY_PERIODS_KEPT = 8


class SubscriberRow(NamedTuple):
    """One subscriber of a topic as fan-out needs it: the page query's columns, in order."""

    installation_id: str
    is_silent: bool
    created_ns: int
    key: bytes | None  # the subscription's key for the envelope's period
    kind: int  # the installation's mechanism kind


class LegacyTarget(NamedTuple):
    """Where an installation's pushes go now."""

    kind: int
    token: str


async def registered_ns(session: AsyncSession, installation_id: str) -> int | None:
    query = select(Installation.registered_ns).where(Installation.id == installation_id).with_for_update()
    return (await session.execute(query)).scalar_one_or_none()


async def upsert_installation(
    session: AsyncSession, installation_id: str, mechanism: Mechanism, now_ns: int
) -> None:
    values = {
        "kind": int(mechanism.kind),
        "token": mechanism.token,
        "registered_ns": now_ns,
        "deleted": False,
    }
    stmt = upsert_insert(session, Installation).values(id=installation_id, **values)
    await session.execute(stmt.on_conflict_do_update(index_elements=[Installation.id], set_=values))


async def mark_deleted(session: AsyncSession, installation_id: str) -> bool:
    stmt = update(Installation).where(Installation.id == installation_id, ~Installation.deleted)
    result: Any = await session.execute(stmt.values(deleted=True))
    return bool(result.rowcount)


async def drop_subscriptions(session: AsyncSession, installation_id: str, created_before_ns: int) -> None:
    """An installation's subscriptions and keys made before a moment (its expiry)."""
    old = select(Sub.topic).where(Sub.installation_id == installation_id, Sub.created_ns < created_before_ns)
    await session.execute(delete(Key).where(Key.installation_id == installation_id, Key.topic.in_(old)))
    await session.execute(
        delete(Sub).where(Sub.installation_id == installation_id, Sub.created_ns < created_before_ns)
    )


async def active_topics(
    session: AsyncSession, installation_id: str, topics: Sequence[str]
) -> tuple[int, int]:
    """(active subscriptions of the installation, how many of `topics` are among them)."""
    query = select(func.count(), func.count().filter(Sub.topic.in_(list(topics)))).where(
        Sub.installation_id == installation_id, Sub.active
    )
    total, among = (await session.execute(query)).one()
    return int(total), int(among)


async def subscribe(
    session: AsyncSession, installation_id: str, specs: Sequence[SubscriptionSpec], now_ns: int, *, keep: bool
) -> None:
    """Each topic active; with `keep`, an existing subscription keeps its silence (Subscribe), else
    it takes the one given (SubscribeWithMetadata)."""
    rows = [
        {
            "topic": s.topic,
            "installation_id": installation_id,
            "active": True,
            "is_silent": s.is_silent,
            "created_ns": now_ns,
        }
        for s in specs
    ]
    stmt = upsert_insert(session, Sub)
    changes = {"active": True} if keep else {"active": True, "is_silent": stmt.excluded.is_silent}
    await session.execute(
        stmt.on_conflict_do_update(index_elements=[Sub.topic, Sub.installation_id], set_=changes), rows
    )
    keys = [
        {"installation_id": installation_id, "topic": s.topic, "period": period, "key": key}
        for s in specs
        for period, key in s.keys.items()
    ]
    if keys:
        key_stmt = upsert_insert(session, Key)
        await session.execute(
            key_stmt.on_conflict_do_update(
                index_elements=[Key.installation_id, Key.topic, Key.period],
                set_={"key": key_stmt.excluded.key},
            ),
            keys,
        )
        await _keep_nearest_periods(session, installation_id, [s.topic for s in specs if s.keys], now_ns)


async def _keep_nearest_periods(
    session: AsyncSession, installation_id: str, topics: Sequence[str], now_ns: int
) -> None:
    """Each subscription keeps the keys of its KEY_PERIODS_KEPT periods nearest now (the later of two
    as near): calls adding keys for ever more periods cannot grow its rows without end, and only a
    key for the period of a message's own time is ever read."""
    now_period = now_ns // PERIOD_NS
    ranked = (
        select(
            Key.topic,
            Key.period,
            func.row_number()
            .over(partition_by=Key.topic, order_by=(func.abs(Key.period - now_period), Key.period.desc()))
            .label("rank"),
        )
        .where(Key.installation_id == installation_id, Key.topic.in_(list(topics)))
        .subquery()
    )
    beyond = select(ranked.c.topic, ranked.c.period).where(ranked.c.rank > KEY_PERIODS_KEPT)
    await session.execute(
        delete(Key).where(Key.installation_id == installation_id, tuple_(Key.topic, Key.period).in_(beyond))
    )


async def unsubscribe(session: AsyncSession, installation_id: str, topics: Sequence[str]) -> int:
    stmt = update(Sub).where(Sub.installation_id == installation_id, Sub.topic.in_(list(topics)), Sub.active)
    result: Any = await session.execute(stmt.values(active=False))
    return int(result.rowcount)


def _page_statement(bounded: bool) -> Any:
    """A topic's pushable subscribers after `after` (and, bounded, at most `until`), in
    installation-id order: two statements, each built once and kept prepared by the driver."""
    query = (
        select(Sub.installation_id, Sub.is_silent, Sub.created_ns, Key.key, Installation.kind)
        .join(Installation, Installation.id == Sub.installation_id)
        .outerjoin(
            Key,
            and_(
                Key.installation_id == Sub.installation_id,
                Key.topic == Sub.topic,
                Key.period == bindparam("period"),
            ),
        )
        .where(
            Sub.topic == bindparam("topic"),
            Sub.active,
            Sub.installation_id > bindparam("after"),
            ~Installation.deleted,
            Installation.token.is_not(None),
            Installation.registered_ns >= bindparam("alive_since"),
        )
        .order_by(Sub.installation_id)
        .limit(bindparam("limit"))
    )
    return query.where(Sub.installation_id <= bindparam("until")) if bounded else query


_PAGES = {bounded: _page_statement(bounded) for bounded in (False, True)}


async def subscribers_page(
    session: AsyncSession,
    topic: str,
    after: str,
    limit: int,
    period: int,
    alive_since_ns: int,
    until: str = "",
) -> list[SubscriberRow]:
    """The next page of a topic's pushable subscribers, in installation-id order after `after` and
    at most `until` ("": to the end)."""
    parameters: dict[str, Any] = {
        "topic": topic,
        "after": after,
        "limit": limit,
        "period": period,
        "alive_since": alive_since_ns,
    }
    if until:
        parameters["until"] = until
    rows = await fetch_rows(session, _PAGES[bool(until)], parameters)
    return [SubscriberRow(*row) for row in rows]


def _range_ends_statement() -> Any:
    # ntile deals the rows out in order into at most `ranges` tiles of sizes differing by one at
    # most; each tile's highest id is where its range ends. The ids are compared and ordered by
    # the database alone, in the column's collation, as the page query compares them.
    tiles = (
        select(
            Sub.installation_id,
            func.ntile(bindparam("ranges")).over(order_by=Sub.installation_id).label("tile"),
        )
        .where(Sub.topic == bindparam("topic"), Sub.active, Sub.installation_id > bindparam("after"))
        .subquery()
    )
    return select(func.max(tiles.c.installation_id)).group_by(tiles.c.tile).order_by(tiles.c.tile)


_RANGE_ENDS = _range_ends_statement()


async def range_ends(session: AsyncSession, topic: str, after: str, ranges: int) -> list[str]:
    """Where each of up to `ranges` installation-id ranges of a topic's active subscriptions after
    `after` ends (inclusive), in order, holding about as many subscriptions each: one query."""
    rows = await fetch_rows(session, _RANGE_ENDS, {"topic": topic, "after": after, "ranges": ranges})
    return [cast(str, row[0]) for row in rows]


def _targets_statement(on_postgresql: bool) -> Any:
    # On PostgreSQL `= ANY(array)`: one statement for any number of ids, which the driver keeps
    # prepared (an IN list is a new statement, parsed and planned, for each length); elsewhere an
    # expanding IN list.
    ids = bindparam("ids", type_=postgresql.ARRAY(Text)) if on_postgresql else None
    chosen = (
        Installation.id == any_(ids)
        if ids is not None
        else Installation.id.in_(bindparam("ids", expanding=True))
    )
    return select(Installation.id, Installation.kind, Installation.token).where(
        chosen,
        ~Installation.deleted,
        Installation.token.is_not(None),
        Installation.registered_ns >= bindparam("alive_since"),
    )


_TARGETS = {on_postgresql: _targets_statement(on_postgresql) for on_postgresql in (False, True)}


async def targets(
    session: AsyncSession, installation_ids: Sequence[str], alive_since_ns: int
) -> dict[str, LegacyTarget]:
    """The current target of each installation that may still be pushed to: one query a batch of
    deliveries, on the hot path's prepared statements (app.core.database.fetch_rows)."""
    if not installation_ids:
        return {}
    statement = _TARGETS[session.get_bind().dialect.name == "postgresql"]
    parameters = {"ids": list(set(installation_ids)), "alive_since": alive_since_ns}
    # kind and token are set together, and the query keeps only rows whose token is set.
    rows = await fetch_rows(session, statement, parameters)
    return {row[0]: LegacyTarget(cast(int, row[1]), cast(str, row[2])) for row in rows}


async def forget_token_if_unchanged(
    session: AsyncSession, installation_id: str, target: LegacyTarget
) -> bool:
    """Remove a dead token, unless a RegisterInstallation replaced it meanwhile."""
    stmt = update(Installation).where(
        Installation.id == installation_id,
        Installation.kind == target.kind,
        Installation.token == target.token,
    )
    result: Any = await session.execute(stmt.values(kind=None, token=None))
    return bool(result.rowcount)


async def delete_expired(session: AsyncSession, cutoff_ns: int, batch: int) -> tuple[int, int]:
    """Up to `batch` installations registered before the cutoff, with their subscriptions and keys,
    and up to `batch` subscriptions as old whose installation never registered; returns how many of
    each were deleted."""
    expired = list(
        (
            await session.execute(
                select(Installation.id).where(Installation.registered_ns < cutoff_ns).limit(batch)
            )
        ).scalars()
    )
    if expired:
        await session.execute(delete(Key).where(Key.installation_id.in_(expired)))
        await session.execute(delete(Sub).where(Sub.installation_id.in_(expired)))
        await session.execute(delete(Installation).where(Installation.id.in_(expired)))
    orphans = (
        select(Sub.installation_id, Sub.topic)
        .where(
            Sub.created_ns < cutoff_ns,
            ~select(Installation.id).where(Installation.id == Sub.installation_id).exists(),
        )
        .limit(batch)
    )
    stale = [tuple(row) for row in await session.execute(orphans)]
    if stale:
        await session.execute(delete(Key).where(tuple_(Key.installation_id, Key.topic).in_(stale)))
        await session.execute(delete(Sub).where(tuple_(Sub.installation_id, Sub.topic).in_(stale)))
    await session.flush()
    return len(expired), len(stale)


# --- an import of the Go server's database (app.legacy.importing): add what is missing only ------


async def active_counts(session: AsyncSession, ids: Sequence[str], made_before_ns: int) -> dict[str, int]:
    """Active subscriptions made before a moment, by installation id (those with none left out)."""
    query = (
        select(Sub.installation_id, func.count())
        .where(Sub.installation_id.in_(list(ids)), Sub.active, Sub.created_ns < made_before_ns)
        .group_by(Sub.installation_id)
    )
    return {row[0]: int(row[1]) for row in await session.execute(query)}


async def existing_installations(session: AsyncSession, ids: Sequence[str]) -> set[str]:
    query = select(Installation.id).where(Installation.id.in_(list(ids)))
    return set((await session.execute(query)).scalars())


async def existing_subscriptions(
    session: AsyncSession, pairs: Sequence[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Which (installation id, topic) pairs are stored."""
    query = select(Sub.installation_id, Sub.topic).where(
        tuple_(Sub.installation_id, Sub.topic).in_(list(pairs))
    )
    return {(row[0], row[1]) for row in await session.execute(query)}


async def existing_keys(
    session: AsyncSession, triples: Sequence[tuple[str, str, int]]
) -> set[tuple[str, str, int]]:
    """Which (installation id, topic, period) keys are stored."""
    columns = (Key.installation_id, Key.topic, Key.period)
    query = select(*columns).where(tuple_(*columns).in_(list(triples)))
    return {(row[0], row[1], row[2]) for row in await session.execute(query)}


async def add_installations(
    session: AsyncSession, installations: Sequence[ImportedInstallation], now_ns: int
) -> None:
    """Each as registered at `now_ns`; an id stored meanwhile keeps what it holds."""
    rows = [
        {
            "id": i.installation_id,
            "kind": int(i.mechanism.kind) if i.mechanism else None,
            "token": i.mechanism.token if i.mechanism else None,
            "registered_ns": now_ns,
            "deleted": i.deleted,
        }
        for i in installations
    ]
    await session.execute(upsert_insert(session, Installation).on_conflict_do_nothing(), rows)


async def add_subscriptions(
    session: AsyncSession, subscriptions: Sequence[ImportedSubscription], now_ns: int
) -> None:
    """Each as created at `now_ns`; a subscription stored meanwhile keeps what it holds."""
    rows = [
        {
            "topic": s.topic,
            "installation_id": s.installation_id,
            "active": s.active,
            "is_silent": s.is_silent,
            "created_ns": now_ns,
        }
        for s in subscriptions
    ]
    await session.execute(upsert_insert(session, Sub).on_conflict_do_nothing(), rows)


async def add_keys(session: AsyncSession, keys: Sequence[ImportedKey]) -> None:
    """Each key under its period; a period's key stored meanwhile is kept."""
    rows = [
        {"installation_id": k.installation_id, "topic": k.topic, "period": k.period, "key": k.key}
        for k in keys
    ]
    await session.execute(upsert_insert(session, Key).on_conflict_do_nothing(), rows)
