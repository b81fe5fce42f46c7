"""The xmtpd firehose listener: one stream of every new envelope, caught up after each reconnect.

On every connection the stream is opened first and its first (empty) answer
awaited; then each known originator is queried from its high-water mark, page
by page, so nothing between the old stream and the new one is missed. What the
stream and the catch-up both deliver is dropped once by (originator, sequence).
Marks are stored only after their envelopes are queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Sequence

import grpc

from app.core import metrics
from app.envelopes.service import enqueue_envelopes
from app.envelopes.types import Envelope
from app.network import repository
from app.network.decoding import MalformedEnvelope, NetworkEnvelope, decode
from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as envelopes
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2 as api
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2_grpc as api_grpc
from app.queue.activity import ListenerState
from app.queue.base import WorkQueue
from app.runtime import Runtime

log = logging.getLogger(__name__)
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
PAGE_LIMIT = 1000
QUERY_TIMEOUT_SECONDS = 30.0
SEEN_CAPACITY = 200_000
MARKS_SAVE_SECONDS = 1.0
BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS = 0.5, 30.0
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


class StreamSilent(Exception):
    """No envelope and no keep-alive within the keep-alive timeout."""


class Listener:
    def __init__(self, runtime: Runtime, queue: WorkQueue) -> None:
        settings = runtime.settings
        if not settings.xmtpd_address:
            raise ValueError("listener needs an xmtpd address")
        self.runtime, self.queue = runtime, queue
        self.address = settings.xmtpd_address
        self.tls = settings.xmtpd_tls
        self.silence_seconds = settings.xmtpd_keepalive_timeout_seconds
        self.max_age_ns = int(settings.xmtpd_catchup_max_age_seconds * 1e9)
        self.marks: dict[int, int] = {}
        self._dirty: dict[int, int] = {}
        self._last_save = 0.0
        self._lag_seconds = 0.0
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()

    async def run(self, stop: asyncio.Event) -> None:
        async with self.runtime.sessions() as session:
            self.marks = await repository.load_marks(session)
        failures = 0
        while not stop.is_set():
            healthy = await self._connect_once(stop)
            if stop.is_set():
                break
            failures = 0 if healthy else failures + 1
            metrics.listener_reconnects_total.inc()
            await _wait(stop, backoff(failures))
        await self._save_marks(force=True)

    async def _connect_once(self, stop: asyncio.Event) -> bool:
        """One connection's life; True when the stream was established before it ended."""
        established = False
        try:
            async with self._channel() as channel:
                stream = api_grpc.NotificationApiStub(channel).SubscribeAllEnvelopes(  # type: ignore[no-untyped-call]
                    api.SubscribeAllEnvelopesRequest()
                )
                try:
                    await self._ingest((await self._next(stream, stop)).envelopes, catch_up=False)
                    established = True
                    await self._catch_up(api_grpc.QueryApiStub(channel))  # type: ignore[no-untyped-call]
                    while not stop.is_set():
                        await self._ingest((await self._next(stream, stop)).envelopes, catch_up=False)
                finally:
                    stream.cancel()
        except StreamSilent:
            log.warning("firehose stream silent too long; reconnecting")
        except grpc.aio.AioRpcError as error:
            log.warning("firehose stream ended: %s", error.code().name)
        except (StopAsyncIteration, asyncio.CancelledError):
            if not stop.is_set():
                log.warning("firehose stream closed by the node")
        except Exception:
            log.exception("listener connection failed")
        return established

    def _channel(self) -> grpc.aio.Channel:
        if self.tls:
            return grpc.aio.secure_channel(
                self.address, grpc.ssl_channel_credentials(), options=CHANNEL_OPTIONS
            )
        return grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)

    async def _next(self, stream: object, stop: asyncio.Event) -> api.SubscribeEnvelopesResponse:
        read = asyncio.ensure_future(stream.read())  # type: ignore[attr-defined]
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait(
            {read, stopped}, timeout=self.silence_seconds, return_when="FIRST_COMPLETED"
        )
        stopped.cancel()
        if read not in done:
            read.cancel()
            if stop.is_set():
                raise asyncio.CancelledError
            raise StreamSilent
        response = read.result()
        if response is _EOF:
            raise StopAsyncIteration
        return response  # type: ignore[no-any-return]

    async def _catch_up(self, query: api_grpc.QueryApiStub) -> None:
        for node, mark in sorted(self.marks.items()):
            await self._catch_up_originator(query, node, mark)

    async def _catch_up_originator(self, query: api_grpc.QueryApiStub, node: int, mark: int) -> None:
        while True:
            request = api.QueryEnvelopesRequest(
                query=api.EnvelopesQuery(
                    originator_node_ids=[node],
                    last_seen=envelopes.Cursor(node_id_to_sequence_id={node: mark}),
                ),
                limit=PAGE_LIMIT,
            )
            page = await query.QueryEnvelopes(request, timeout=QUERY_TIMEOUT_SECONDS)
            metrics.listener_catchup_total.inc(len(page.envelopes))
            newest = await self._ingest(page.envelopes, catch_up=True)
            if len(page.envelopes) < PAGE_LIMIT or newest.get(node, 0) <= mark:
                return
            mark = newest[node]

    async def _ingest(
        self, batch: Sequence[envelopes.OriginatorEnvelope], *, catch_up: bool
    ) -> dict[int, int]:
        """Decode, dedupe and queue one response or page; returns the highest sequence per originator."""
        pushable: list[Envelope] = []
        newest: dict[int, int] = {}
        now_ns = time.time_ns()
        for raw in batch:
            item = self._decode(raw)
            if item is None:
                continue
            node, sequence = item.key
            newest[node] = max(newest.get(node, 0), sequence)
            if self._already_seen(item.key):
                metrics.listener_dropped_total.labels("duplicate").inc()
            elif item.envelope is None:
                metrics.listener_dropped_total.labels("not_pushable").inc()
            elif catch_up and now_ns - item.originator_ns > self.max_age_ns:
                metrics.listener_dropped_total.labels("stale").inc()
            else:
                pushable.append(item.envelope)
            self._lag_seconds = max(0.0, (now_ns - item.originator_ns) / 1e9)
            metrics.listener_lag_seconds.set(self._lag_seconds)
        if pushable:
            await enqueue_envelopes(self.queue, pushable)
        self._raise_marks(newest)
        await self._save_marks()
        return newest

    def _decode(self, raw: envelopes.OriginatorEnvelope) -> NetworkEnvelope | None:
        try:
            item = decode(raw)
        except MalformedEnvelope:
            metrics.listener_envelopes_total.labels("malformed").inc()
            metrics.listener_dropped_total.labels("malformed").inc()
            return None
        metrics.listener_envelopes_total.labels(item.kind).inc()
        return item

    def _already_seen(self, key: tuple[int, int]) -> bool:
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > SEEN_CAPACITY:
            self._seen.popitem(last=False)
        return False

    def _raise_marks(self, newest: dict[int, int]) -> None:
        for node, sequence in newest.items():
            if sequence > self.marks.get(node, -1):
                self.marks[node] = sequence
                self._dirty[node] = sequence

    async def _save_marks(self, *, force: bool = False) -> None:
        if not self._dirty or (not force and time.monotonic() - self._last_save < MARKS_SAVE_SECONDS):
            return
        dirty, self._dirty = self._dirty, {}
        try:
            async with self.runtime.sessions() as session, session.begin():
                await repository.save_marks(session, dirty, time.time_ns())
        except Exception:
            self._dirty = {**dirty, **self._dirty}
            log.exception("could not store listener marks; will retry")
            return
        self._last_save = time.monotonic()
        await self._report_lag()

    async def _report_lag(self) -> None:
        activity = self.runtime.activity
        if activity is not None:
            with contextlib.suppress(Exception):  # telemetry only
                await activity.set_listener(ListenerState(self._lag_seconds, time.time()))


def backoff(failures: int) -> float:
    """Capped exponential with full jitter; a short pause even after a healthy stream ended."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0**failures)
    return random.uniform(ceiling / 2, ceiling)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_listener(runtime: Runtime, stop: asyncio.Event) -> None:
    if runtime.queue is None:
        raise RuntimeError("the listener needs a queue")
    await Listener(runtime, runtime.queue).run(stop)
