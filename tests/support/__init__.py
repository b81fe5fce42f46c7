"""Helpers shared by the tests: databases, settings and a running API."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
from sqlalchemy import text

from app.core.config import Settings
from app.core.migrations import upgrade
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.runtime import Runtime, open_runtime
from fakes import keys
from workers.server import running_api

POSTGRES_ADMIN_DSN = os.environ.get(
    "XMTP_PUSH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


async def create_empty_postgres_database(prefix: str = "xmtp_push_test") -> str:
    """A fresh PostgreSQL database without the schema; returns its SQLAlchemy URL."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return f"{base}/{name}"


async def create_postgres_database() -> str:
    """A fresh, migrated PostgreSQL database; returns its SQLAlchemy URL."""
    url = await create_empty_postgres_database()
    await asyncio.to_thread(upgrade, Settings(database_url=url))
    return url


async def drop_postgres_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


async def create_sqlite_database(folder: Path) -> str:
    url = f"sqlite+aiosqlite:///{folder / 'xmtp-push-test.db'}"
    await asyncio.to_thread(upgrade, Settings(database_url=url))
    return url


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test: every channel configured, loopback webhooks allowed, free ports."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
        "apns_key": keys.apns_key_pem(),
        "apns_key_id": "KEYID12345",
        "apns_team_id": "TEAMID1234",
        "apns_bundle_id": "org.example.app",
        "fcm_service_account": keys.service_account(),
        "webhook_enabled": True,
        "webhook_allow_insecure": True,
        "webhook_allow_private_addresses": True,
    }
    values.update(overrides)
    return Settings(**values)


async def clear_tables(runtime: Runtime) -> None:
    async with runtime.engine.begin() as connection:
        await connection.execute(text("DELETE FROM subscriptions"))
        await connection.execute(text("DELETE FROM recipients"))
        for table in ("legacy_hmac_keys", "legacy_subscriptions", "legacy_installations"):
            await connection.execute(text(f"DELETE FROM {table}"))


@dataclass
class Api:
    """A running API: its runtime, a gRPC stub on the real port and an HTTP client."""

    runtime: Runtime
    grpc_channel: grpc.aio.Channel
    stub: notification_pb2_grpc.NotificationServiceStub
    http: httpx.AsyncClient
    http_port: int
    grpc_port: int


@asynccontextmanager
async def running(settings: Settings, *, clear: bool = True, gateway: bool = False) -> AsyncIterator[Api]:
    async with open_runtime(settings, gateway=gateway) as runtime, running_api(runtime) as servers:
        if clear:
            await clear_tables(runtime)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{servers.grpc_port}")
        base_url = f"http://127.0.0.1:{servers.http_port}"
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            try:
                yield Api(
                    runtime,
                    channel,
                    notification_pb2_grpc.NotificationServiceStub(channel),
                    http,
                    servers.http_port,
                    servers.grpc_port,
                )
            finally:
                await channel.close()


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the test session's objects out of garbage collection while in the block. A full
    collection of a long run's heap stalls the loop for a moment no product process has (the product
    freezes its start-up objects), and a test timing the loop would take it for the product's."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def host_lock(url: str) -> int:
    """An open descriptor of the host-wide lock file of the test service at `url`: test runs started
    side by side take it in turn (closing the descriptor releases it)."""
    name = "".join(c if c.isalnum() else "_" for c in url)
    return os.open(os.path.join(tempfile.gettempdir(), f"xmtp-push-test-{name}.lock"), os.O_RDWR | os.O_CREAT)


def took_host_lock(descriptor: int) -> bool:
    """Whether this run holds the lock now; False while another run holds it."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
