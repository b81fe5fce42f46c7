"""Stored legacy installations, their topic subscriptions and their subscriptions' HMAC keys.

Contract: docs/legacy.md#what-is-stored. A subscription is stored under its installation's id
whether or not that installation has registered yet (an SDK may subscribe first), so there is
no foreign key between the two; the sweep removes what no registration keeps alive.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, Integer, LargeBinary, SmallInteger, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base


class LegacyInstallation(Base):
    __tablename__ = "legacy_installations"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    # The delivery mechanism: 1 apns, 2 fcm, 3 custom (app.legacy.commands.MechanismKind); both
    # null once its token was found dead, until the next RegisterInstallation.
    kind: Mapped[int | None] = mapped_column(SmallInteger, nullable=True)
    token: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The last RegisterInstallation: the installation expires a TTL after it, deleted or not.
    registered_ns: Mapped[int] = mapped_column(BigInteger)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (Index("ix_legacy_installations_registered_ns", "registered_ns"),)


class LegacySubscription(Base):
    __tablename__ = "legacy_subscriptions"
    # The primary key leads with the topic: a topic's subscribers are one index range scan, paged
    # by installation id.
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    installation_id: Mapped[str] = mapped_column(Text, primary_key=True)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    is_silent: Mapped[bool] = mapped_column(Boolean, default=False)
    created_ns: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_legacy_subscriptions_installation_id", "installation_id"),)


class LegacyHmacKey(Base):
    """One subscription's key for one thirty-day period."""

    __tablename__ = "legacy_hmac_keys"

    installation_id: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    period: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[bytes] = mapped_column(LargeBinary(64))
