"""Alembic environment: runs revisions through the project's async engine settings."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

# Importing the models registers their tables on Base.metadata.
import app.legacy.models
import app.network.models
import app.recipients.models  # noqa: F401
from app.core.database import Base

target_metadata = Base.metadata


def _database_url() -> str:
    url = context.config.attributes.get("database_url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        from app.core.config import load_settings

        url = load_settings().database_url
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_database_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
