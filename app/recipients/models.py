"""Stored recipients and their topic subscriptions."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, LargeBinary, SmallInteger, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base


class Recipient(Base):
    __tablename__ = "recipients"

    id: Mapped[bytes] = mapped_column(LargeBinary(32), primary_key=True)
    # Only SHA-256(recipient_secret) is stored.
    secret_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    channel: Mapped[int] = mapped_column(SmallInteger)
    # APNs/FCM device token or webhook URL.
    target: Mapped[str] = mapped_column(Text)
    # Raw webhook signing key; kept because every hint is signed with it.
    signing_key: Mapped[bytes | None] = mapped_column(LargeBinary(64), nullable=True)
    topic_count: Mapped[int] = mapped_column(Integer, default=0)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    renewed_ns: Mapped[int] = mapped_column(BigInteger, index=True)


class Subscription(Base):
    __tablename__ = "subscriptions"
    # The primary key leads with the topic: every subscriber of a topic is
    # one index range scan, paged by recipient id.
    topic: Mapped[bytes] = mapped_column(LargeBinary(33), primary_key=True)
    recipient_id: Mapped[bytes] = mapped_column(
        LargeBinary(32), ForeignKey("recipients.id", ondelete="CASCADE"), primary_key=True
    )
    # Backend clock when the subscription was first stored: envelopes that
    # arrived earlier are never pushed to it. Re-adding keeps it.
    start_ns: Mapped[int] = mapped_column(BigInteger)
    hmac_epoch_base: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Up to three 42-byte keys, concatenated (key n is for epoch base + n).
    hmac_keys: Mapped[bytes | None] = mapped_column(LargeBinary(126), nullable=True)
    include_commits: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (Index("ix_subscriptions_recipient_id", "recipient_id"),)
