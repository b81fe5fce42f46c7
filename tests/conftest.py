from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from app.core.config import Settings
from tests.support import (
    Api,
    create_postgres_database,
    create_sqlite_database,
    drop_postgres_database,
    make_settings,
    running,
)
from tests.support.redis_cluster import redis_cluster  # noqa: F401  (the test Redis Cluster, a fixture)

# Fixtures for every test module: the fakes of the remote ends (one fixture per fake); the test tiers:
# services marked from fixtures, an absent one failing in one line, the fast tier held to its bound.
pytest_plugins = ["tests.support.fakes", "tests.support.tiers"]


@pytest.fixture(scope="session")
async def postgresql_url() -> AsyncIterator[str]:
    url = await create_postgres_database()
    yield url
    await drop_postgres_database(url)


@pytest.fixture(scope="session")
async def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return await create_sqlite_database(tmp_path_factory.mktemp("sqlite"))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test that uses it runs once on SQLite and once on PostgreSQL."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    async with running(settings) as started:
        yield started


@pytest.fixture
def api_with(database_url: str) -> Callable[..., AbstractAsyncContextManager[Api]]:
    """Start an API with some settings changed: `async with api_with(max_push_topics=2) as api:`."""

    def start(**overrides: Any) -> AbstractAsyncContextManager[Api]:
        return running(make_settings(database_url, **overrides))

    return start
