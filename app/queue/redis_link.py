"""The process's way to Redis: one client for a single Redis or a Redis Cluster, found at first use.

`XMTP_PUSH_REDIS_CLUSTER` = auto asks the server (`INFO cluster` answers `cluster_enabled:1` on a
cluster node); true / false skip the question. A cluster is reached through redis-py's
RedisCluster, which follows MOVED and ASK itself; what it gives up on during a failover
(CLUSTERDOWN, TRYAGAIN, a connection refused by the failed primary) is tried again here, with
backoff, within a bound, and one log line says when Redis became unavailable and one when it
answers again. Connections are bounded per node (`XMTP_PUSH_REDIS_MAX_CONNECTIONS`); a call that
finds them all busy waits for one (a semaphore in front of the client, as the cluster client's own
pool would fail instead), never fails.

Nothing is asked of Redis when the link is made: a process whose Redis is down at start-up starts
all the same and reports not ready until Redis answers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MaxConnectionsError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")
ClusterMode = Literal["auto", "true", "false"]
# What a failover or a restart shows for a few seconds: tried again, not failed at once.
TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
    BusyLoadingError,
    MaxConnectionsError,
    ConnectionError,
    OSError,
)
# A call is given up after this: the caller's loop backs off and comes back (a failover outlasting
# it is ridden out there), and a stopping process is not held up long.
RETRY_SECONDS = 3.0
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 1.0
SOCKET_TIMEOUT_SECONDS = 30
CONNECT_TIMEOUT_SECONDS = 10
# RESP2 replies (lists of [id, fields]): the queue's parsing relies on that shape.
PROTOCOL = 2

Connected = Callable[[Any], Awaitable[None]]


class RedisLink:
    """A client made on first use, calls retried through a failover, connections bounded."""

    def __init__(
        self,
        url: str,
        mode: ClusterMode = "auto",
        max_connections: int = 64,
        on_connect: Connected | None = None,
        on_recover: Callable[[], None] | None = None,
    ) -> None:
        self._url, self._mode, self._max_connections = url, mode, max_connections
        self._on_connect, self._on_recover = on_connect, on_recover
        self._client: Any = None
        self._connecting = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_connections)
        self._failing = False
        self._answered = False
        self.cluster = False

    async def client(self) -> Any:
        """The client, made (and the cluster question asked) on first use."""
        if self._client is None:
            async with self._connecting:
                if self._client is None:
                    await self._connect()
        return self._client

    async def _connect(self) -> None:
        cluster = self._mode == "true" or (self._mode == "auto" and await self._asks_cluster())
        client: Any = await self._cluster_client() if cluster else self._single_client()
        try:
            if self._on_connect is not None:
                await self._on_connect(client)
        except BaseException:
            await client.aclose()
            raise
        self._client, self.cluster = client, cluster
        if cluster:
            log.info("redis: cluster, %d primaries", len(client.get_primaries()))
        else:
            log.info("redis: single")

    async def _asks_cluster(self) -> bool:
        probe = Redis.from_url(
            self._url, protocol=PROTOCOL, socket_timeout=CONNECT_TIMEOUT_SECONDS,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        )  # fmt: skip
        try:
            info = await probe.info("cluster")
        finally:
            await probe.aclose()
        return int(info.get("cluster_enabled", 0)) == 1

    async def _cluster_client(self) -> RedisCluster:
        client = RedisCluster.from_url(
            self._url,
            protocol=PROTOCOL,
            max_connections=self._max_connections,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        )
        try:
            await client.initialize()
        except BaseException:
            await client.aclose()
            raise
        return client

    def _single_client(self) -> Redis:
        # A blocking pool: a call finding every connection busy waits for one.
        pool = BlockingConnectionPool.from_url(
            self._url,
            max_connections=self._max_connections,
            timeout=None,
            protocol=PROTOCOL,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
            health_check_interval=30,
        )
        return Redis(connection_pool=pool)

    async def run(self, call: Callable[[Any], Awaitable[T]], *, retry: bool = True) -> T:
        """`call(client)`, tried again through transient failures for up to RETRY_SECONDS
        (`retry=False`: once, for what only reports, such as gauges and probes)."""
        deadline = time.monotonic() + (RETRY_SECONDS if retry else 0.0)
        tries = 0
        while True:
            try:
                async with self._slots:
                    result = await call(await self.client())
            except Exception as error:
                failure = _transient(error)
                if failure is None:
                    raise
                tries += 1
                pause = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2.0 ** (tries - 1))
                pause *= 0.5 + random.random()
                self._state(failing=True, error=failure)
                if time.monotonic() + pause > deadline:
                    if failure is error:
                        raise
                    raise failure from error
                await asyncio.sleep(pause)
                continue
            self._state(failing=False)
            return result

    def _state(self, *, failing: bool, error: BaseException | None = None) -> None:
        # A Redis that never answered is the caller's to tell, naming its setting (app/ops/failures.py,
        # app/core/dependencies.py); the link tells a failover of one that did.
        if failing == self._failing or (failing and not self._answered):
            self._answered = self._answered or not failing
            return
        self._answered = True
        self._failing = failing
        if failing:
            log.warning("redis: unavailable (%s); retrying with backoff", type(error).__name__)
        else:
            log.warning("redis: available again")
            if self._on_recover is not None:
                self._on_recover()

    async def server_client(self) -> Redis:
        """A plain client of one server, for a subscription: the Redis itself, or a node of the
        cluster picked at random (classic pub/sub reaches every node). The caller closes it."""
        url = self._url
        client = await self.client()
        if self.cluster:
            node = random.choice(client.get_nodes())
            parts = urlsplit(url)
            credentials = parts.netloc.rpartition("@")[0]
            netloc = f"{credentials}@{node.host}:{node.port}" if credentials else f"{node.host}:{node.port}"
            url = urlunsplit(parts._replace(netloc=netloc))
        return Redis.from_url(
            url, protocol=PROTOCOL, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, health_check_interval=30
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _transient(error: Exception) -> Exception | None:
    """`error` as a failure to try again (one of TRANSIENT), or None for one that is not."""
    if isinstance(error, TRANSIENT):
        return error
    if isinstance(error, AttributeError | TypeError) and _torn_down(error):
        return RedisConnectionError(f"a connection closed under the call ({type(error).__name__})")
    return None


def _torn_down(error: BaseException) -> bool:
    """A connection closed under a call: redis-py then fails inside its connection code with an
    AttributeError or TypeError (its writer or the transport's callbacks gone) rather than a
    ConnectionError. The cluster client closes a failed node's connections while other calls are on
    them, so a failover shows this as well as a reset idle connection (redis-py issue 4287)."""
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_globals.get("__name__") == "redis.asyncio.connection":
            return True
        traceback = traceback.tb_next
    return False


async def client_of(source: Any) -> Any:
    """The client behind `source`: a RedisLink's (made on first use), or `source` itself (a client)."""
    return await source.client() if isinstance(source, RedisLink) else source
