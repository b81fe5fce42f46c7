"""Every query on recipients and subscriptions. Functions flush, never commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.recipients.models import Recipient, Subscription
from app.recipients.types import Delivery, SubscriptionSpec


@dataclass(frozen=True, slots=True)
class SubscriberRow:
    """What fan-out needs of one subscription and its recipient."""

    recipient_id: bytes
    start_ns: int
    hmac_epoch_base: int | None
    hmac_keys: bytes | None
    include_commits: bool
    channel: int


def _insert(session: AsyncSession, model: Any) -> Any:
    """INSERT with ON CONFLICT support for the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)


async def get_recipient(
    session: AsyncSession, recipient_id: bytes, *, lock: bool = False
) -> Recipient | None:
    query = select(Recipient).where(Recipient.id == recipient_id)
    if lock:
        # Serialises concurrent updates of one recipient so topic_count stays exact.
        query = query.with_for_update()
    return (await session.execute(query)).scalar_one_or_none()


async def upsert_recipient(
    session: AsyncSession, recipient_id: bytes, secret_hash: bytes, delivery: Delivery, now_ns: int
) -> int | None:
    """Create, or replace channel and target of a recipient with the same secret hash.

    Returns the topic count, or None when the id is taken under another secret
    (the secret check and the write are one statement, so no race can slip in).
    """
    stmt = _insert(session, Recipient).values(
        id=recipient_id,
        secret_hash=secret_hash,
        channel=int(delivery.channel),
        target=delivery.target,
        signing_key=delivery.signing_key,
        topic_count=0,
        created_ns=now_ns,
        renewed_ns=now_ns,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[Recipient.id],
        set_={
            "channel": stmt.excluded.channel,
            "target": stmt.excluded.target,
            "signing_key": stmt.excluded.signing_key,
            "renewed_ns": stmt.excluded.renewed_ns,
        },
        where=Recipient.secret_hash == stmt.excluded.secret_hash,
    ).returning(Recipient.topic_count)
    return (await session.execute(stmt)).scalar_one_or_none()


async def delete_recipient(session: AsyncSession, recipient_id: bytes) -> None:
    await session.execute(delete(Subscription).where(Subscription.recipient_id == recipient_id))
    await session.execute(delete(Recipient).where(Recipient.id == recipient_id))


async def existing_topics(session: AsyncSession, recipient_id: bytes, topics: Sequence[bytes]) -> set[bytes]:
    if not topics:
        return set()
    query = select(Subscription.topic).where(
        Subscription.recipient_id == recipient_id, Subscription.topic.in_(topics)
    )
    return set((await session.execute(query)).scalars())


async def upsert_subscriptions(
    session: AsyncSession, recipient_id: bytes, specs: Sequence[SubscriptionSpec], now_ns: int
) -> None:
    """Insert new subscriptions; for existing ones replace keys and flags, keep start_ns."""
    if not specs:
        return
    stmt = _insert(session, Subscription)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Subscription.topic, Subscription.recipient_id],
        set_={
            "hmac_epoch_base": stmt.excluded.hmac_epoch_base,
            "hmac_keys": stmt.excluded.hmac_keys,
            "include_commits": stmt.excluded.include_commits,
        },
    )
    await session.execute(stmt, [_subscription_row(recipient_id, spec, now_ns) for spec in specs])


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


async def delete_subscriptions(session: AsyncSession, recipient_id: bytes, topics: Sequence[bytes]) -> None:
    if topics:
        await session.execute(
            delete(Subscription).where(
                Subscription.recipient_id == recipient_id, Subscription.topic.in_(topics)
            )
        )


async def renew(session: AsyncSession, recipient_id: bytes, topic_count: int, now_ns: int) -> None:
    await session.execute(
        update(Recipient)
        .where(Recipient.id == recipient_id)
        .values(topic_count=topic_count, renewed_ns=now_ns)
    )


async def count_subscriptions(session: AsyncSession, recipient_id: bytes) -> int:
    query = select(func.count()).select_from(Subscription).where(Subscription.recipient_id == recipient_id)
    return int((await session.execute(query)).scalar_one())


async def targets_by_id(session: AsyncSession, ids: Sequence[bytes]) -> dict[bytes, Recipient]:
    """The current delivery target of each recipient that still exists."""
    if not ids:
        return {}
    rows = await session.execute(select(Recipient).where(Recipient.id.in_(set(ids))))
    return {recipient.id: recipient for recipient in rows.scalars()}


async def delete_if_unchanged(
    session: AsyncSession, recipient_id: bytes, channel: int, target: str, signing_key: bytes | None, secret_hash: bytes
) -> bool:
    """Delete a recipient whose token or webhook is dead, unless it re-registered since."""
    query = select(Recipient).where(Recipient.id == recipient_id).with_for_update()
    recipient = (await session.execute(query)).scalar_one_or_none()
    unchanged = recipient is not None and (
        recipient.channel,
        recipient.target,
        recipient.signing_key,
        recipient.secret_hash,
    ) == (channel, target, signing_key, secret_hash)
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


def subscribers_query(topic: bytes, after_recipient_id: bytes, limit: int) -> Any:
    """One page of a topic's subscribers in recipient-id order: a primary-key range scan,
    joined to each recipient's channel by its primary key."""
    return (
        select(
            Subscription.recipient_id,
            Subscription.start_ns,
            Subscription.hmac_epoch_base,
            Subscription.hmac_keys,
            Subscription.include_commits,
            Recipient.channel,
        )
        .join(Recipient, Recipient.id == Subscription.recipient_id)
        .where(Subscription.topic == topic, Subscription.recipient_id > after_recipient_id)
        .order_by(Subscription.recipient_id)
        .limit(limit)
    )


async def subscribers_page(
    session: AsyncSession, topic: bytes, after_recipient_id: bytes, limit: int
) -> list[SubscriberRow]:
    rows = await session.execute(subscribers_query(topic, after_recipient_id, limit))
    return [SubscriberRow(*row) for row in rows]
