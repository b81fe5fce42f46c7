"""Read-only aggregate queries behind the operator views."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.recipients.models import Recipient, Subscription


async def recipients_by_channel(session: AsyncSession) -> dict[int, int]:
    rows = await session.execute(select(Recipient.channel, func.count()).group_by(Recipient.channel))
    return {int(channel): int(count) for channel, count in rows}


async def subscription_count(session: AsyncSession) -> int:
    return int((await session.execute(select(func.count()).select_from(Subscription))).scalar_one())
