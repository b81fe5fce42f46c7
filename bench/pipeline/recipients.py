"""The HTTP recipients of a run: made up here, then registered over gRPC or bulk-inserted."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from bench._support import RECIPIENT_COLUMNS, SUBSCRIPTION_COLUMNS, asyncpg_dsn

HTTP_CHANNEL = 3


@dataclass(frozen=True, slots=True)
class Recipient:
    id: bytes
    secret: bytes
    key: bytes
    topic: bytes


def make_topics(count: int) -> list[bytes]:
    return [b"\x00" + secrets.token_bytes(16) for _ in range(count)]


def make_recipients(count: int, topics: Sequence[bytes]) -> list[Recipient]:
    return [
        Recipient(
            secrets.token_bytes(32), secrets.token_bytes(32), secrets.token_bytes(32), topics[i % len(topics)]
        )
        for i in range(count)
    ]


async def _register_one(stub: notification_pb2_grpc.NotificationServiceStub, r: Recipient, url: str) -> None:
    await stub.Register(
        pb.RegisterRequest(
            recipient_id=r.id,
            recipient_secret=r.secret,
            http=pb.HttpDelivery(url=url, signing_key=r.key),
        ),
        timeout=30,
    )
    await stub.UpdateSubscriptions(
        pb.UpdateSubscriptionsRequest(
            recipient_id=r.id, recipient_secret=r.secret, adds=[pb.Subscription(topic=r.topic)]
        ),
        timeout=30,
    )


async def register_over_grpc(
    grpc_port: int, recipients: Sequence[Recipient], url: str, concurrency: int
) -> float:
    started = time.monotonic()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]
        queue: asyncio.Queue[Recipient] = asyncio.Queue()
        for recipient in recipients:
            queue.put_nowait(recipient)

        async def one() -> None:
            while not queue.empty():
                await _register_one(stub, queue.get_nowait(), url)

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return time.monotonic() - started


def _insert_sqlite(database_url: str, recipient_rows: list[Any], subscription_rows: list[Any]) -> None:
    import sqlite3

    path = database_url.split("///", 1)[1]
    connection = sqlite3.connect(path)
    with connection:
        connection.executemany(
            f"INSERT INTO recipients ({','.join(RECIPIENT_COLUMNS)}) VALUES (?,?,?,?,?,?,?,?)",
            recipient_rows,
        )
        connection.executemany(
            f"INSERT INTO subscriptions ({','.join(SUBSCRIPTION_COLUMNS)}) VALUES (?,?,?,?,?,?)",
            subscription_rows,
        )
    connection.close()


async def _copy_postgres(database_url: str, recipient_rows: list[Any], subscription_rows: list[Any]) -> None:
    import asyncpg

    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with connection.transaction():
            await connection.copy_records_to_table(
                "recipients", records=recipient_rows, columns=RECIPIENT_COLUMNS
            )
            await connection.copy_records_to_table(
                "subscriptions", records=subscription_rows, columns=SUBSCRIPTION_COLUMNS
            )
        await connection.execute("ANALYZE recipients; ANALYZE subscriptions")
    finally:
        await connection.close()


async def copy_recipients(database_url: str, recipients: Sequence[Recipient], url: str) -> float:
    """Bulk insert recipients and their one subscription each (PostgreSQL COPY, or SQLite executemany)."""
    started = time.monotonic()
    now = time.time_ns()
    start_ns = now - 10 * 1_000_000_000
    recipient_rows = [
        (r.id, hashlib.sha256(r.secret).digest(), HTTP_CHANNEL, url, r.key, 1, now, now) for r in recipients
    ]
    subscription_rows = [(r.topic, r.id, start_ns, None, None, False) for r in recipients]
    if database_url.startswith("sqlite"):
        _insert_sqlite(database_url, recipient_rows, subscription_rows)
    else:
        await _copy_postgres(database_url, recipient_rows, subscription_rows)
    return time.monotonic() - started
