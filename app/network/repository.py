"""Queries on the listener's high-water marks. Functions flush, never commit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.network.models import ListenerCursor


async def load_marks(session: AsyncSession) -> dict[int, int]:
    rows = await session.execute(select(ListenerCursor.originator_node_id, ListenerCursor.sequence_id))
    return {int(node): int(sequence) for node, sequence in rows}


async def save_marks(session: AsyncSession, marks: Mapping[int, int], now_ns: int) -> None:
    """Raise each originator's mark to the given value; a mark never moves back."""
    if not marks:
        return
    insert: Any = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = insert(ListenerCursor)
    stmt = stmt.on_conflict_do_update(
        index_elements=[ListenerCursor.originator_node_id],
        set_={"sequence_id": stmt.excluded.sequence_id, "updated_ns": stmt.excluded.updated_ns},
        where=ListenerCursor.sequence_id < stmt.excluded.sequence_id,
    )
    rows = [{"originator_node_id": n, "sequence_id": s, "updated_ns": now_ns} for n, s in marks.items()]
    await session.execute(stmt, rows)
