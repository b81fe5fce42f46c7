"""The Marmot notification server's long-running part: one connection per relay, each reopened with
backoff and jitter when it drops, goes silent past the watchdog, or is closed by the relay; live gift
wraps offered to the pending buffer (app/marmot/pending.py), whose handlers take them in arrival order,
at most MARMOT_MAX_CONCURRENT at once: a relay's reader never waits for them.

The protocol (what to send, how to answer) is app/marmot/relay_session.py; this module owns the sockets.
Relays are named in logs by their host (app/marmot/relay_session.py, `relay_names`), never by URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp
from redis.asyncio import Redis

from app.core import metrics
from app.core.config import MARMOT_MAX_FRAME_BYTES, Settings
from app.delivery.registry import ProviderRegistry
from app.marmot.admission import Dedup
from app.marmot.dispatch import MARMOT_CHANNELS, ApnsPayload
from app.marmot.keys import ServerKey
from app.marmot.pending import PendingTriggers, TriggerSink
from app.marmot.push_health import PushHealth
from app.marmot.relay_session import Published, RelaySession, ok_answer, relay_names
from app.marmot.shared_limits import SharedKeys, SharedLimits
from app.marmot.triggers import Limits, SharedTriggerHandler, TriggerHandler, TriggerResult, count_trigger
from app.marmot.wrap_queue import QueueSettings, WrapQueue
from app.queue.redis_link import TRANSIENT, RedisLink

log = logging.getLogger("workers.marmot_server")

# The opening handshake (TCP, TLS, HTTP upgrade) is given up after this.
HANDSHAKE_SECONDS = 15.0
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 60.0
# Pending and in-flight triggers are given this long to finish their pushes on the way out.
STOP_GRACE_SECONDS = 10.0
CONNECTION_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
# `marmot send-test` waits this long for the relay's answer, connecting included.
PUBLISH_SECONDS = 15.0


class Backoff:
    """Doubling delays with jitter (each between half and all of the current step), reset once a
    connection is subscribed again."""

    def __init__(self, first: float = BACKOFF_FIRST_SECONDS, limit: float = BACKOFF_MAX_SECONDS) -> None:
        self._first, self._limit, self._step = first, limit, first

    def next(self) -> float:
        step, self._step = self._step, min(self._limit, self._step * 2)
        return random.uniform(step / 2, step)

    def reset(self) -> None:
        self._step = self._first


class Intake(Protocol):
    """Where a relay's reader hands each live gift wrap, never waiting."""

    def offer(self, event: dict[str, Any], text: str) -> object: ...

    def serving(self, grace: float) -> contextlib.AbstractAsyncContextManager[None]: ...


class AloneIntake:
    """A process working alone: its own buffer and handlers (app/marmot/pending.py)."""

    def __init__(self, handler: TriggerSink[dict[str, Any]], settings: Settings) -> None:
        self._pending = PendingTriggers(
            handler, settings.marmot_max_concurrent, settings.marmot_pending_bytes
        )
        self.serving = self._pending.serving

    def offer(self, event: dict[str, Any], text: str) -> object:
        return self._pending.offer(event, len(text))  # what it holds: about its frame's text


class MarmotServer:
    """The relay connections of one server key and the triggers they bring in."""

    def __init__(
        self,
        settings: Settings,
        key: ServerKey,
        providers: ProviderRegistry,
        handler: TriggerSink[dict[str, Any]],
        queue: WrapQueue | None = None,
        health: PushHealth | None = None,
    ) -> None:
        """Live gift wraps go to `queue` (shared with the other processes serving the key) when given,
        else to this process's own handlers; `health` follows the handlers' pushes."""
        self._settings, self._key, self._providers = settings, key, providers
        self._health = PushHealth() if health is None else health
        self._relays = settings.marmot_relays
        self._names = dict(enumerate(relay_names(self._relays), 1))  # by position, as `subscribed`
        self.handler = handler
        self._intake: Intake = queue if queue is not None else AloneIntake(handler, settings)
        self.connected: set[int] = set()
        self.subscribed: set[int] = set()

    async def relays_ready(self) -> bool:
        """At least one relay connected and subscribed (readiness)."""
        return bool(self.subscribed)

    async def can_push(self) -> bool:
        """At least one of Marmot's channels configured, and none failing most of its recent pushes
        (readiness)."""
        configured = any(self._providers.get(channel) is not None for channel in MARMOT_CHANNELS)
        return configured and self._health.delivering()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve every relay until `stop` is set; then let pending and in-flight triggers finish
        (bounded)."""
        watchdog = self._settings.marmot_relay_watchdog_seconds
        self._say_relays_up()  # 0 until the first relay connects
        timeout = aiohttp.ClientTimeout(total=None, connect=HANDSHAKE_SECONDS, sock_connect=HANDSHAKE_SECONDS)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            self._intake.serving(STOP_GRACE_SECONDS),  # its grace starts once the relays' loops end
        ):
            loops = [
                asyncio.create_task(self._relay_loop(http, number, url, watchdog))
                for number, url in enumerate(self._relays, 1)
            ]
            try:
                await stop.wait()
            finally:
                for loop in loops:
                    loop.cancel()
                await asyncio.gather(*loops, return_exceptions=True)

    async def _relay_loop(self, http: aiohttp.ClientSession, number: int, url: str, watchdog: float) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._connection(http, number, url, watchdog, backoff)
            except CONNECTION_ERRORS as error:
                log.info(
                    "relay %s: connection lost or refused (%s)", self._names[number], type(error).__name__
                )
            except Exception as error:  # a bug: this relay is tried again all the same
                log.error("relay %s: connection failed (%s)", self._names[number], type(error).__name__)
            await asyncio.sleep(backoff.next())

    async def _connection(
        self, http: aiohttp.ClientSession, number: int, url: str, watchdog: float, backoff: Backoff
    ) -> None:
        session = RelaySession(url, self._key, self._relays)
        async with (
            asyncio.timeout(HANDSHAKE_SECONDS) as handshake,
            http.ws_connect(
                url,
                # The watchdog: a ping every half of it, and nothing at all (no pong, no message) for a
                # quarter more closes the connection. No receive timeout besides: aiohttp would arm
                # and cancel a timer for every message.
                heartbeat=watchdog / 2,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
                max_msg_size=MARMOT_MAX_FRAME_BYTES,
                autoping=True,
            ) as ws,
            self._connected(number),
        ):
            handshake.reschedule(None)
            for frame in session.opening():
                await ws.send_str(frame)
            async for message in ws:
                if message.type is not aiohttp.WSMsgType.TEXT:
                    continue
                if not await self._react(ws, session, number, message.data, backoff):
                    return
        log.info("relay %s: connection closed", self._names[number])

    async def _react(self, ws: Any, session: RelaySession, number: int, text: str, backoff: Backoff) -> bool:
        """Answer one message; False when the connection should be given up."""
        reaction = session.receive(text)
        for frame in reaction.send:
            await ws.send_str(frame)
        if reaction.notice:
            log.info("relay %s: %s", self._names[number], reaction.notice)
        self._note_subscription(number, session.live, backoff)
        if reaction.backlog:
            count_trigger(TriggerResult.BACKLOG)
        if reaction.trigger is not None:
            self._intake.offer(reaction.trigger, text)
        return not reaction.reconnect

    def _note_subscription(self, number: int, live: bool, backoff: Backoff) -> None:
        if live and number not in self.subscribed:
            self.subscribed.add(number)
            backoff.reset()
            log.info("relay %s: subscribed", self._names[number])
        elif not live:
            self.subscribed.discard(number)

    @contextlib.asynccontextmanager
    async def _connected(self, number: int) -> AsyncIterator[None]:
        self.connected.add(number)
        metrics.marmot_relays_connected.inc()
        self._say_relays_up()
        try:
            yield
        finally:
            self.connected.discard(number)
            self.subscribed.discard(number)
            metrics.marmot_relays_connected.dec()
            self._say_relays_up()

    def _say_relays_up(self) -> None:
        """`xmtp_push_dependency_up{dependency="relay"}`: 1 while at least one relay is connected."""
        metrics.dependency_up.labels("relay").set(1 if self.connected else 0)


@contextlib.asynccontextmanager
async def open_marmot(settings: Settings, providers: ProviderRegistry) -> AsyncIterator[MarmotServer]:
    """The server of the configured key: sharing its gift wraps, limits and duplicate memory with the
    other processes serving the key through Redis when one is configured, else alone."""
    if settings.marmot_secret_key is None:
        raise ValueError("XMTP_PUSH_MARMOT_SECRET_KEY is not set")
    key = ServerKey.parse(settings.marmot_secret_key.get_secret_value())
    limits = Limits.from_settings(settings)
    if not settings.redis_url:
        log.info(
            "Marmot: no XMTP_PUSH_REDIS_URL; this process works alone (its own limits and duplicate memory)"
        )
        health = PushHealth()
        handler = TriggerHandler(
            key,
            providers,
            Dedup(settings.marmot_dedup_seconds),
            limits,
            settings.marmot_pushes_in_flight,
            apns=ApnsPayload.from_settings(settings),
            health=health,
        )
        yield MarmotServer(settings, key, providers, handler, health=health)
        return
    link = RedisLink(settings.redis_url, settings.redis_cluster, settings.redis_max_connections)
    async with _shared_client(link, settings.redis_url) as redis:
        yield shared_server(settings, key, providers, redis)


@contextlib.asynccontextmanager
async def _shared_client(link: RedisLink, url: str) -> AsyncIterator[Any]:
    """The link's client (a cluster client on a Redis Cluster). A Redis that does not answer at
    start-up gets a single-node client that connects once it does: the server pushes alone meanwhile."""
    fallback: Redis | None = None
    try:
        try:
            client = await link.client()
        except TRANSIENT:
            client = fallback = Redis.from_url(url)
        yield client
    finally:
        await link.close()
        if fallback is not None:
            await fallback.aclose()


def shared_server(
    settings: Settings, key: ServerKey, providers: ProviderRegistry, redis: Any
) -> MarmotServer:
    """A server whose wraps, limits and duplicate memory are shared through `redis`
    (app/marmot/wrap_queue.py, app/marmot/shared_limits.py)."""
    keys, limits = SharedKeys(key.public_hex), Limits.from_settings(settings)
    shared = SharedLimits(redis, keys, limits.chunk, limits.device, settings.marmot_dedup_seconds)
    health = PushHealth()
    handler = SharedTriggerHandler(
        key,
        providers,
        Dedup(settings.marmot_dedup_seconds),
        limits,
        settings.marmot_pushes_in_flight,
        shared=shared,
        apns=ApnsPayload.from_settings(settings),
        health=health,
    )
    queue_settings = QueueSettings(
        settings.marmot_max_concurrent,
        settings.marmot_pending_bytes,
        limits.global_,
        settings.queue_reclaim_seconds,
    )
    log.info("Marmot: gift wraps, limits and duplicate memory shared through Redis")
    queue = WrapQueue(redis, keys, handler, queue_settings)
    return MarmotServer(settings, key, providers, handler, queue, health)


async def publish(url: str, event: Mapping[str, Any]) -> Published:
    """Send one event to the relay at `url` and return its OK answer. TimeoutError when it gives none
    within PUBLISH_SECONDS; one of CONNECTION_ERRORS when it cannot be reached or closes first."""
    async with (
        asyncio.timeout(PUBLISH_SECONDS),
        aiohttp.ClientSession() as http,
        http.ws_connect(url, max_msg_size=MARMOT_MAX_FRAME_BYTES) as ws,
    ):
        await ws.send_str(json.dumps(["EVENT", event], separators=(",", ":")))
        async for message in ws:
            answer = ok_answer(message.data, event["id"]) if message.type is aiohttp.WSMsgType.TEXT else None
            if answer is not None:
                return answer
    raise ConnectionResetError("the relay closed the connection without answering")
