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
import time
from collections import OrderedDict
from collections.abc import Sequence

import grpc

from app.core import metrics
from app.envelopes.types import Envelope
from app.fanout.service import enqueue_envelopes
from app.legacy.fanout import enqueue_legacy, from_network
from app.network import repository
from app.network.decoding import MalformedEnvelope, decode
from app.ops.failures import tell_or_log
from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as envelopes
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2 as api
from app.proto.xmtp.xmtpv4.message_api import message_api_pb2_grpc as api_grpc
from app.queue.activity import LISTENER_STATES, ListenerState
from app.queue.base import WorkQueue
from app.runtime import Runtime
from workers.outage import Reachability, keep_connected, node_channel

log = logging.getLogger(__name__)
# What the listener does while the network node, the database or Redis cannot serve (told once).
RECONNECTS = "the listener reconnects with backoff"
KEEPS_MARKS = "the listener keeps its marks until it serves"
XMTPD_ADDRESS = "XMTP_PUSH_XMTPD_ADDRESS"
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
PAGE_LIMIT = 1000
QUERY_TIMEOUT_SECONDS = 30.0
SEEN_CAPACITY = 200_000
MARKS_SAVE_SECONDS = 1.0
# The listener's state and lag reach /status at least this often while the stream is open.
REPORT_SECONDS = 10.0
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


class StreamSilent(Exception):
    """No envelope and no keep-alive within the keep-alive timeout."""


class _Stopped(Exception):
    """The stop event was set while waiting for the stream."""


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
        self._state = "connecting"
        self._last_report = 0.0
        # The highest sequence the node has shown per originator, and the highest stored (the cursor).
        self._shown: dict[int, int] = {}
        self._stored: dict[int, int] = {}
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        # Whether the firehose stream is open now (readiness), and whether the last attempts to open
        # it failed (told once, not at every retry).
        self._open = False
        self._reach = Reachability(log, XMTPD_ADDRESS, "the xmtpd node", "the firehose")

    async def firehose_open(self) -> bool:
        """Readiness: the firehose stream is open (the node answered it)."""
        return self._open

    async def run(self, stop: asyncio.Event) -> None:
        async with self.runtime.sessions() as session:
            self.marks = await repository.load_marks(session)
        self._stored = dict(self.marks)
        await keep_connected(stop, self._connect_once, metrics.listener_reconnects_total)
        await self._save_marks(force=True)
        await self._enter("stopped")

    async def _connect_once(self, stop: asyncio.Event) -> bool:
        """One connection's life; True when the stream was established before it ended."""
        established = opened = False
        await self._enter("connecting")
        try:
            async with self._channel() as channel:
                stream = api_grpc.NotificationApiStub(channel).SubscribeAllEnvelopes(  # type: ignore[no-untyped-call]
                    api.SubscribeAllEnvelopesRequest()
                )
                try:
                    first = await self._next(stream, stop)
                    opened = self._open = True
                    self._reach.answered()
                    log.info("firehose stream open")
                    await self._ingest(first.envelopes, catch_up=False)
                    established = True
                    await self._enter("catching_up")
                    await self._catch_up(api_grpc.QueryApiStub(channel))  # type: ignore[no-untyped-call]
                    await self._enter("live")
                    while not stop.is_set():
                        await self._ingest((await self._next(stream, stop)).envelopes, catch_up=False)
                finally:
                    self._open = False
                    stream.cancel()
        except StreamSilent:
            log.warning("firehose stream silent too long; reconnecting")
        except grpc.aio.AioRpcError as error:
            if opened:
                log.warning("firehose stream ended: %s; reconnecting", error.code().name)
            else:
                self._reach.failed(error.code())
        except _Stopped:
            pass
        except StopAsyncIteration:
            if not stop.is_set():
                log.warning("firehose stream closed by the node")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the listener itself is being cancelled: never swallow that
            log.warning("firehose stream cancelled")
        except Exception as error:
            tell_or_log(error, self.runtime.dependencies, RECONNECTS, log, "listener connection failed")
        return established

    def _channel(self) -> grpc.aio.Channel:
        return node_channel(self.address, tls=self.tls, options=CHANNEL_OPTIONS)

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
                raise _Stopped
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
        fresh: dict[tuple[int, int], None] = {}  # first seen in this batch
        # Metrics are tallied here and applied once per batch (nothing can read them in between).
        kinds: dict[str, int] = {}
        dropped: dict[str, int] = {}
        last_ns: int | None = None
        seen = self._seen
        max_age_ns = self.max_age_ns
        now_ns = time.time_ns()
        try:
            for raw in batch:
                try:
                    item = decode(raw)
                except MalformedEnvelope:
                    kinds["malformed"] = kinds.get("malformed", 0) + 1
                    dropped["malformed"] = dropped.get("malformed", 0) + 1
                    continue
                kinds[item.kind] = kinds.get(item.kind, 0) + 1
                node, sequence = key = item.originator_node_id, item.originator_sequence_id
                highest = newest.get(node)
                if highest is None or sequence > highest:
                    newest[node] = sequence
                    if sequence > self._shown.get(node, -1):
                        self._shown[node] = sequence
                if key in seen or key in fresh:
                    reason = "duplicate"
                else:
                    fresh[key] = None
                    if item.envelope is None:
                        reason = "not_pushable"
                    elif catch_up and now_ns - item.originator_ns > max_age_ns:
                        reason = "stale"
                    else:
                        pushable.append(item.envelope)
                        reason = ""
                if reason:
                    dropped[reason] = dropped.get(reason, 0) + 1
                last_ns = item.originator_ns
        finally:
            self._count(kinds, dropped, now_ns, last_ns)
        if pushable:
            await enqueue_envelopes(self.queue, pushable)
            if self.runtime.settings.legacy_api_enabled:
                await enqueue_legacy(self.queue, from_network(pushable))
        # Only once queued: what failed to queue is read again by the next catch-up, not a duplicate.
        self._remember(fresh)
        self._raise_marks(newest)
        metrics.listener_lag_envelopes.set(self._lag_envelopes())
        await self._save_marks()
        if time.monotonic() - self._last_report >= REPORT_SECONDS:  # a quiet network: keep-alives
            await self._report_lag()
        return newest

    def _count(
        self, kinds: dict[str, int], dropped: dict[str, int], now_ns: int, last_ns: int | None
    ) -> None:
        for kind, count in kinds.items():
            metrics.listener_envelopes_total.labels(kind).inc(count)
        for reason, count in dropped.items():
            metrics.listener_dropped_total.labels(reason).inc(count)
        if last_ns is not None:
            self._lag_seconds = max(0.0, (now_ns - last_ns) / 1e9)
            metrics.listener_lag_seconds.set(self._lag_seconds)

    def _remember(self, keys: dict[tuple[int, int], None]) -> None:
        seen = self._seen
        seen.update(keys)
        while len(seen) > SEEN_CAPACITY:
            seen.popitem(last=False)

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
        except Exception as error:
            self._dirty = {**dirty, **self._dirty}
            bug = "could not store listener marks; will retry"
            tell_or_log(error, self.runtime.dependencies, KEEPS_MARKS, log, bug)
            return
        self.runtime.dependencies.up("database")
        self._last_save = time.monotonic()
        self._stored.update(dirty)
        await self._report_lag()

    async def _enter(self, state: str) -> None:
        self._state = state
        metrics.listener_state.set(LISTENER_STATES.index(state))
        if state != "stopped":  # xmtpd serves while the stream is open (catching up, then live)
            metrics.dependency_up.labels("xmtpd").set(0 if state == "connecting" else 1)
        await self._report_lag()

    def _lag_envelopes(self) -> int:
        """Envelopes the node has shown past the stored cursor (what a restart would read again)."""
        return sum(max(0, shown - self._stored.get(node, 0)) for node, shown in self._shown.items())

    async def _report_lag(self) -> None:
        self._last_report = time.monotonic()
        lag_envelopes = self._lag_envelopes()
        metrics.listener_lag_envelopes.set(lag_envelopes)
        activity = self.runtime.activity
        if activity is not None:
            state = ListenerState(self._lag_seconds, time.time(), self._state, lag_envelopes)
            with contextlib.suppress(Exception):  # telemetry only
                await activity.set_listener(state)


def new_listener(runtime: Runtime) -> Listener:
    if runtime.queue is None:
        raise RuntimeError("the listener needs a queue")
    return Listener(runtime, runtime.queue)


async def run_listener(runtime: Runtime, stop: asyncio.Event) -> None:
    await new_listener(runtime).run(stop)
