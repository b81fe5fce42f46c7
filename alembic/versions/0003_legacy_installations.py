"""legacy notifications.v1 installations, subscriptions and HMAC keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "legacy_installations",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("kind", sa.SmallInteger(), nullable=True),
        sa.Column("token", sa.Text(), nullable=True),
        sa.Column("registered_ns", sa.BigInteger(), nullable=False),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_legacy_installations"),
    )
    op.create_index("ix_legacy_installations_registered_ns", "legacy_installations", ["registered_ns"])
    op.create_table(
        "legacy_subscriptions",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("installation_id", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("is_silent", sa.Boolean(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "installation_id", name="pk_legacy_subscriptions"),
    )
    op.create_index("ix_legacy_subscriptions_installation_id", "legacy_subscriptions", ["installation_id"])
    op.create_table(
        "legacy_hmac_keys",
        sa.Column("installation_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("period", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("key", sa.LargeBinary(64), nullable=False),
        sa.PrimaryKeyConstraint("installation_id", "topic", "period", name="pk_legacy_hmac_keys"),
    )


def downgrade() -> None:
    op.drop_table("legacy_hmac_keys")
    op.drop_index("ix_legacy_subscriptions_installation_id", table_name="legacy_subscriptions")
    op.drop_table("legacy_subscriptions")
    op.drop_index("ix_legacy_installations_registered_ns", table_name="legacy_installations")
    op.drop_table("legacy_installations")
