"""listener high-water marks per originator

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "listener_cursors",
        sa.Column("originator_node_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sequence_id", sa.BigInteger(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("originator_node_id", name="pk_listener_cursors"),
    )


def downgrade() -> None:
    op.drop_table("listener_cursors")
