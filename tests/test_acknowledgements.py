"""An acknowledgement that could not be written while Redis was away is written once it is back,
well before the reclaim period: the hints already sent are not sent a second time."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis.asyncio import Redis

from app.core.config import Settings
from app.queue.base import delivery_stream, partition_of
from app.queue.redis_calls import stream_key
from app.queue.redis_link import RETRY_SECONDS
from fakes.webhook_receiver import Receiver
from tests.support.pipeline import (  # noqa: F401  (fixtures)
    Stack,
    envelope,
    group_topic,
    redis_postgresql_stack,
    redis_url,
    running_pipeline,
    wait_until,
)
from tests.support.proxy import TcpProxy

SUBSCRIBERS = 10
HELD_SECONDS = 1.0  # each hint's request, answered while Redis is cut off
PARTITIONS = Settings.model_fields["queue_partitions"].default


def through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}"))


async def test_acknowledgements_that_failed_are_written_once_redis_is_back(
    redis_postgresql_stack: Stack, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    assert redis_postgresql_stack.redis_url is not None
    port = urlsplit(redis_postgresql_stack.redis_url).port or 6379
    topic = group_topic()
    stream = stream_key(delivery_stream("http"), partition_of(topic, PARTITIONS))
    async with TcpProxy(port) as proxy, Redis.from_url(redis_postgresql_stack.redis_url) as direct:
        stack = dataclasses.replace(
            redis_postgresql_stack, redis_url=through(proxy, redis_postgresql_stack.redis_url)
        )
        # A reclaim period far longer than the test: only the worker's own acknowledgement can
        # take the entries off the stream.
        async with running_pipeline(stack, queue_reclaim_seconds=600) as pipe:
            for _ in range(SUBSCRIBERS):
                await pipe.member(receiver.endpoint(delays=[HELD_SECONDS]), topic)
            with caplog.at_level(logging.WARNING):
                await pipe.ingest_ok([envelope(topic, 1)])
                await wait_until(lambda: receiver.active() == SUBSCRIBERS, 10, "every hint in flight")
                proxy.cut()
                answered = lambda: sum(r.answered for r in receiver.all_requests()) == SUBSCRIBERS  # noqa: E731
                await wait_until(answered, 10, "every hint answered")
                # The worker's commit, sent within a flush period of the answers, fails once its
                # Redis calls have retried for RETRY_SECONDS; a commit dropped then would leave the
                # entries to the reclaim period.
                await asyncio.sleep(RETRY_SECONDS + 1.5)
                assert await direct.xlen(stream) == SUBSCRIBERS  # none acknowledged yet
                proxy.mend()
                await wait_until_empty(direct, stream, 10)
            await asyncio.sleep(0.5)
    assert len(receiver.all_requests()) == SUBSCRIBERS, "hints sent a second time"


async def wait_until_empty(redis: Redis, stream: str, seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := await redis.xlen(stream)) > 0:
        assert asyncio.get_running_loop().time() < deadline, f"{left} entries still unacknowledged"
        await asyncio.sleep(0.05)
