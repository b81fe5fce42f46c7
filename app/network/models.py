"""The listener's durable high-water mark per originator node."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base


class ListenerCursor(Base):
    __tablename__ = "listener_cursors"

    originator_node_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # Highest originator_sequence_id queued for fan-out (uint64 stored in a signed column:
    # sequence ids stay far below 2**63).
    sequence_id: Mapped[int] = mapped_column(BigInteger)
    updated_ns: Mapped[int] = mapped_column(BigInteger)
