"""recipients and subscriptions

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "recipients",
        sa.Column("id", sa.LargeBinary(32), nullable=False),
        sa.Column("secret_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("channel", sa.SmallInteger(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("signing_key", sa.LargeBinary(64), nullable=True),
        sa.Column("topic_count", sa.Integer(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("renewed_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_recipients"),
    )
    op.create_index("ix_recipients_renewed_ns", "recipients", ["renewed_ns"])
    op.create_table(
        "subscriptions",
        sa.Column("topic", sa.LargeBinary(33), nullable=False),
        sa.Column("recipient_id", sa.LargeBinary(32), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("hmac_epoch_base", sa.BigInteger(), nullable=True),
        sa.Column("hmac_keys", sa.LargeBinary(126), nullable=True),
        sa.Column("include_commits", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["recipient_id"],
            ["recipients.id"],
            name="fk_subscriptions_recipient_id_recipients",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("topic", "recipient_id", name="pk_subscriptions"),
    )
    op.create_index("ix_subscriptions_recipient_id", "subscriptions", ["recipient_id"])


def downgrade() -> None:
    op.drop_index("ix_subscriptions_recipient_id", table_name="subscriptions")
    op.drop_table("subscriptions")
    op.drop_index("ix_recipients_renewed_ns", table_name="recipients")
    op.drop_table("recipients")
