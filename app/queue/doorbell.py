"""Wake-ups across processes: work one process adds to a stream, the resting readers of the others
take at once instead of after their rest (`IDLE_POLL_SECONDS` in redis_streams, up to 0.2 s).

A process that adds to a stream publishes the stream's name on one channel; each process that reads
holds one subscription and ends its readers' rest for that stream. Classic pub/sub reaches every node
of a Redis Cluster, so the subscription may sit on any node. It only hastens: a message lost, or a
subscription down (made again with backoff, waking every reader once), leaves the readers to their
polls, which go on as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any

from app.queue.redis_calls import PREFIX
from app.queue.redis_link import TRANSIENT, RedisLink

log = logging.getLogger(__name__)
CHANNEL = PREFIX + "added"
BACKOFF_SECONDS = (0.1, 5.0)  # between subscriptions made again: the first, the longest
CLOSE_SECONDS = 1.0
Wake = Callable[[Collection[str] | None], None]  # the streams' readers to wake; None: every reader


class Doorbell:
    def __init__(self, link: RedisLink, wake: Wake) -> None:
        self._link, self._wake = link, wake
        self._listener: asyncio.Task[None] | None = None
        self._subscriber: Any = None  # the subscription's client while it is open
        self._backoff = BACKOFF_SECONDS[0]
        self._closed = False

    async def ring(self, streams: Collection[str]) -> None:
        """Tell the other processes' readers that `streams` have new work; never fails the caller."""
        if streams:
            with contextlib.suppress(*TRANSIENT):
                await self._link.run(lambda client: _publish(client, streams), retry=False)

    def listen(self) -> None:
        """Subscribe, from this process's first reader on (in the running loop)."""
        if self._listener is None and not self._closed:
            self._listener = asyncio.get_running_loop().create_task(self._subscription())

    async def _subscription(self) -> None:
        while not self._closed:
            try:
                await self._subscribed()
            except TRANSIENT as error:  # told by the queue's own calls, which meet the same outage
                log.debug("doorbell: subscription lost (%s)", type(error).__name__)
            except Exception as error:
                log.warning(
                    "doorbell: subscription failed (%s); readers poll meanwhile", type(error).__name__
                )
            self._wake(None)  # what was rung meanwhile
            await asyncio.sleep(self._backoff)
            self._backoff = min(BACKOFF_SECONDS[1], self._backoff * 2)

    async def _subscribed(self) -> None:
        client = self._subscriber = await self._link.server_client()
        try:
            async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(CHANNEL)
                self._backoff = BACKOFF_SECONDS[0]
                async for message in pubsub.listen():
                    self._wake(message["data"].decode().split(","))
        finally:
            self._subscriber = None
            await client.aclose()

    async def close(self) -> None:
        """End the subscription. Told three ways, as a cancellation landing inside the client's
        connection code can be absorbed there: the flag ends the loop, closing the client ends a
        wait for messages, and the wait for the task is bounded."""
        self._closed = True
        if self._listener is None:
            return
        self._listener.cancel()
        if self._subscriber is not None:
            with contextlib.suppress(Exception):
                await self._subscriber.aclose()
        await asyncio.wait({self._listener}, timeout=CLOSE_SECONDS)
        self._listener = None


async def _publish(client: Any, streams: Collection[str]) -> None:
    await client.publish(CHANNEL, ",".join(sorted(streams)))
