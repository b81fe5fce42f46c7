"""Every query on recipients and subscriptions. Functions flush, never commit."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    Table,
    any_,
    bindparam,
    column,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.database import fetch_rows, upsert_insert
from app.recipients.models import Recipient, Subscription
from app.recipients.types import DELIVERY_CHANNELS, Delivery, SubscriptionSpec, Target


class SubscriberRow(NamedTuple):
    """What fan-out needs of one subscription and its recipient: the shape of the page query's rows,
    which are handed over as they come (named after the query's columns), not copied into objects."""

    recipient_id: bytes
    start_ns: int
    hmac_epoch_base: int | None
    hmac_keys: bytes | None
    include_commits: bool
    channel: int


async def get_recipient(
    session: AsyncSession, recipient_id: bytes, *, lock: bool = False
) -> Recipient | None:
    query = select(Recipient).where(Recipient.id == recipient_id)
    if lock:
        # Serialises concurrent updates of one recipient so topic_count stays exact.
        query = query.with_for_update()
    return (await session.execute(query)).scalar_one_or_none()


class Upserted(NamedTuple):
    topic_count: int
    created: bool  # the statement inserted the recipient (an update keeps its creation time)


async def upsert_recipient(
    session: AsyncSession, recipient_id: bytes, secret_hash: bytes, delivery: Delivery, now_ns: int
) -> Upserted | None:
    """Create, or replace channel and target of a recipient with the same secret hash.

    Returns the topic count and whether it was created, or None when the id is taken under
    another secret (the secret check and the write are one statement, so no race can slip in).
    """
    stmt = _upsert_recipient_statement(session.get_bind().dialect.name)
    params = {
        "id": recipient_id,
        "secret_hash": secret_hash,
        "channel": int(delivery.channel),
        "target": delivery.target,
        "signing_key": delivery.signing_key,
        "topic_count": 0,
        "created_ns": now_ns,
        "renewed_ns": now_ns,
    }
    row = (await session.execute(stmt, params)).one_or_none()
    return None if row is None else Upserted(row[0], row[1] == now_ns)


_RECIPIENT_COLUMNS = tuple(column.name for column in Recipient.__table__.columns)


@functools.cache
def _upsert_recipient_statement(dialect_name: str) -> Any:
    """Built once per dialect, on the Core table with bound parameters: building the ORM
    statement with literal values for every call cost more CPU than its round trip."""
    table = cast(Table, Recipient.__table__)
    insert = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
    stmt = insert(table).values({name: bindparam(name) for name in _RECIPIENT_COLUMNS})
    return stmt.on_conflict_do_update(
        index_elements=[table.c.id],
        set_={
            "channel": stmt.excluded.channel,
            "target": stmt.excluded.target,
            "signing_key": stmt.excluded.signing_key,
            "renewed_ns": stmt.excluded.renewed_ns,
        },
        where=table.c.secret_hash == stmt.excluded.secret_hash,
    ).returning(table.c.topic_count, table.c.created_ns)


async def delete_recipient(session: AsyncSession, recipient_id: bytes) -> None:
    await session.execute(delete(Subscription).where(Subscription.recipient_id == recipient_id))
    await session.execute(delete(Recipient).where(Recipient.id == recipient_id))


async def _existing_topics(session: AsyncSession, recipient_id: bytes, topics: Sequence[bytes]) -> set[bytes]:
    """Which of these topics the recipient already has (SQLite's way to count new rows)."""
    query = select(Subscription.topic).where(
        Subscription.recipient_id == recipient_id, Subscription.topic.in_(topics)
    )
    return set((await session.execute(query)).scalars())


async def upsert_subscriptions(
    session: AsyncSession, recipient_id: bytes, specs: Sequence[SubscriptionSpec], now_ns: int
) -> int:
    """Insert new subscriptions; for existing ones replace keys and flags, keep start_ns.
    Returns how many were new."""
    if not specs:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        parameters = _subscription_arrays(specs) | {"recipient_id": recipient_id, "start_ns": now_ns}
        result = await (await session.connection()).execute(_upsert_over_arrays(), parameters)
        return sum(1 for (new,) in result if new)
    rows = [_subscription_row(recipient_id, spec, now_ns) for spec in specs]
    present = await _existing_topics(session, recipient_id, [row["topic"] for row in rows])
    await session.execute(_on_conflict_replace_keys(upsert_insert(session, Subscription)), rows)
    return len(rows) - len(present)


def _on_conflict_replace_keys(stmt: Any) -> Any:
    return stmt.on_conflict_do_update(
        index_elements=[Subscription.topic, Subscription.recipient_id],
        set_={
            "hmac_epoch_base": stmt.excluded.hmac_epoch_base,
            "hmac_keys": stmt.excluded.hmac_keys,
            "include_commits": stmt.excluded.include_commits,
        },
    )


@functools.cache
def _upsert_over_arrays() -> Any:
    """PostgreSQL: one INSERT ... SELECT FROM unnest() of one array parameter per varying column.
    An executemany is one INSERT execution per row on the server (1000 executor start-ups and
    round trips' worth of work for a full request). xmax is 0 exactly on the rows it inserted.
    Built once: a reused statement keeps its cache key and compiled form."""
    arrays = (("topics", LargeBinary), ("bases", BigInteger), ("keys", LargeBinary), ("commits", Boolean))
    incoming = (
        func.unnest(*(bindparam(name, type_=postgresql.ARRAY(kind)) for name, kind in arrays))
        .table_valued(
            column("topic", LargeBinary),
            column("hmac_epoch_base", BigInteger),
            column("hmac_keys", LargeBinary),
            column("include_commits", Boolean),
        )
        .render_derived(name="incoming")
    )
    rows = select(
        incoming.c.topic,
        bindparam("recipient_id", type_=LargeBinary),
        bindparam("start_ns", type_=BigInteger),
        incoming.c.hmac_epoch_base,
        incoming.c.hmac_keys,
        incoming.c.include_commits,
    )
    columns = ["topic", "recipient_id", "start_ns", "hmac_epoch_base", "hmac_keys", "include_commits"]
    stmt = postgresql.insert(Subscription).from_select(columns, rows)
    return _on_conflict_replace_keys(stmt).returning(literal_column("(xmax = 0)", Boolean))


def _subscription_arrays(specs: Sequence[SubscriptionSpec]) -> dict[str, list[Any]]:
    keyed = [bool(spec.hmac_keys) for spec in specs]
    return {
        "topics": [spec.topic for spec in specs],
        "bases": [spec.hmac_epoch_base if k else None for spec, k in zip(specs, keyed, strict=True)],
        "keys": [b"".join(spec.hmac_keys) if k else None for spec, k in zip(specs, keyed, strict=True)],
        "commits": [spec.include_commits for spec in specs],
    }


def _subscription_row(recipient_id: bytes, spec: SubscriptionSpec, now_ns: int) -> dict[str, Any]:
    has_keys = bool(spec.hmac_keys)
    return {
        "topic": spec.topic,
        "recipient_id": recipient_id,
        "start_ns": now_ns,
        "hmac_epoch_base": spec.hmac_epoch_base if has_keys else None,
        "hmac_keys": b"".join(spec.hmac_keys) if has_keys else None,
        "include_commits": spec.include_commits,
    }


async def delete_subscriptions(session: AsyncSession, recipient_id: bytes, topics: Sequence[bytes]) -> int:
    """Delete the recipient's subscriptions to these topics; returns how many existed."""
    if not topics:
        return 0
    stmt = (
        delete(Subscription)
        .where(Subscription.recipient_id == recipient_id, Subscription.topic.in_(topics))
        .returning(Subscription.topic)
    )
    return len((await session.execute(stmt)).all())


async def renew(session: AsyncSession, recipient_id: bytes, topic_count: int, now_ns: int) -> None:
    await session.execute(
        update(Recipient)
        .where(Recipient.id == recipient_id)
        .values(topic_count=topic_count, renewed_ns=now_ns)
    )


async def targets_by_id(session: AsyncSession, ids: Sequence[bytes]) -> dict[bytes, Target]:
    """The current delivery target of each recipient that still exists."""
    if not ids:
        return {}
    statement = _TARGETS[session.get_bind().dialect.name == "postgresql"]
    rows = await fetch_rows(session, statement, {"ids": list(set(ids))})
    return {row[0]: Target(DELIVERY_CHANNELS[row[1]], *row[2:]) for row in rows}


async def delete_if_unchanged(session: AsyncSession, recipient_id: bytes, target: Target) -> bool:
    """Delete a recipient whose token or webhook is dead, unless it re-registered since."""
    query = select(Recipient).where(Recipient.id == recipient_id).with_for_update()
    recipient = (await session.execute(query)).scalar_one_or_none()
    unchanged = recipient is not None and (
        DELIVERY_CHANNELS.get(recipient.channel),
        recipient.target,
        recipient.signing_key,
        recipient.secret_hash,
    ) == tuple(target)
    if unchanged:
        await delete_recipient(session, recipient_id)
    return unchanged


async def delete_expired(session: AsyncSession, cutoff_ns: int, batch: int) -> int:
    """Delete up to `batch` recipients not renewed since cutoff_ns, with their subscriptions."""
    # Rows locked here cannot be renewed until this transaction ends; rows a
    # request holds are skipped and looked at again by the next sweep.
    query = (
        select(Recipient.id)
        .where(Recipient.renewed_ns < cutoff_ns)
        .limit(batch)
        .with_for_update(skip_locked=True)
    )
    ids = list((await session.execute(query)).scalars())
    if ids:
        await session.execute(delete(Subscription).where(Subscription.recipient_id.in_(ids)))
        await session.execute(delete(Recipient).where(Recipient.id.in_(ids)))
    return len(ids)


def _subscribers_statement(bounded: bool) -> Any:
    """One page of a topic's subscribers in recipient-id order, above `after` and, when `bounded`,
    at most `until`: a primary-key range scan, with each recipient's channel looked up by its
    primary key. Built once with bound parameters: a statement object that is reused keeps its
    cache key, which SQLAlchemy would otherwise work out again on every page."""
    # A correlated scalar subquery, not a join: PostgreSQL runs it as one
    # pk_recipients probe per returned row. Joined, the planner was free to
    # drive the page from recipients instead (a hash join over a Seq Scan of
    # every recipient for a topic's last pages, ~50-80 ms at 120,000
    # recipients and growing with the table; or a pk_recipients walk from its
    # start), so a page's cost depended on where in the topic it was.
    channel = select(Recipient.channel).where(Recipient.id == Subscription.recipient_id)
    channel_column = channel.scalar_subquery().label("channel")
    query = (
        select(
            Subscription.recipient_id,
            Subscription.start_ns,
            Subscription.hmac_epoch_base,
            Subscription.hmac_keys,
            Subscription.include_commits,
            channel_column,
        )
        .where(Subscription.topic == bindparam("topic"), Subscription.recipient_id > bindparam("after"))
        .order_by(Subscription.recipient_id)
        .limit(bindparam("limit", type_=Integer))
    )
    return query.where(Subscription.recipient_id <= bindparam("until")) if bounded else query


_SUBSCRIBERS = {bounded: _subscribers_statement(bounded) for bounded in (False, True)}
_TARGET_COLUMNS = select(
    Recipient.id, Recipient.channel, Recipient.target, Recipient.signing_key, Recipient.secret_hash
)
# By whether the database is PostgreSQL: `= ANY(array)` there, one statement for any number of
# ids that the driver keeps prepared; an expanding IN list elsewhere.
_TARGETS = {
    True: _TARGET_COLUMNS.where(Recipient.id == any_(bindparam("ids", type_=postgresql.ARRAY(LargeBinary)))),
    False: _TARGET_COLUMNS.where(Recipient.id.in_(bindparam("ids", expanding=True))),
}


def _page_parameters(topic: bytes, after: bytes, limit: int, until: bytes) -> dict[str, Any]:
    parameters: dict[str, Any] = {"topic": topic, "after": after, "limit": limit}
    if until:
        parameters["until"] = until
    return parameters


def subscribers_query(topic: bytes, after_recipient_id: bytes, limit: int, until: bytes = b"") -> Any:
    """The page statement with its values bound: what `subscribers_page` sends."""
    return _SUBSCRIBERS[bool(until)].params(_page_parameters(topic, after_recipient_id, limit, until))


async def subscribers_page(
    session: AsyncSession, topic: bytes, after_recipient_id: bytes, limit: int, until: bytes = b""
) -> list[SubscriberRow]:
    parameters = _page_parameters(topic, after_recipient_id, limit, until)
    rows = await fetch_rows(session, _SUBSCRIBERS[bool(until)], parameters)
    return [SubscriberRow(*row) for row in rows]
