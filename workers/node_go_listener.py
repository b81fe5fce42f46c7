"""The node-go listener: xmtp-node-go's `MessageApi/SubscribeAll`, every envelope of every topic as it
is published, queued for legacy subscriptions (docs/legacy.md#from-envelope-to-push).

node-go keeps no cursor a listener could catch up from: what it publishes while no stream is open is
not read. Availability comes from replicas instead: two or more `listen` processes each queue all they
read, and the legacy fan-out claims each envelope once by its idempotency key.

Reading and queueing are two tasks around a bounded buffer, so the stream is read while a batch is
being queued (batches grow with the load). A batch the queue refused is queued again, never dropped;
while it is refused the buffer fills and reading stops, which holds the node's stream back rather than
losing what it sent. An envelope is done only once it is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from app.core import metrics
from app.core.dependencies import DependencyLog
from app.legacy import topics
from app.legacy.fanout import enqueue_legacy
from app.legacy.jobs import LegacyEnvelope
from app.legacy.messages import idempotency_key
from app.ops.failures import tell_or_log
from app.proto.xmtp.message_api.v1 import message_api_pb2 as node_go
from app.queue.activity import NODE_GO, ActivityLog, ListenerState
from app.queue.base import WorkQueue
from app.runtime import Runtime
from workers.outage import Outage, Reachability, keep_connected, node_channel

log = logging.getLogger(__name__)
NODE_GO_ADDRESS = "XMTP_PUSH_NODE_GO_ADDRESS"
RECONNECTS = "the node-go listener reconnects with backoff"
SUBSCRIBE_ALL = "/xmtp.message_api.v1.MessageApi/SubscribeAll"
_EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
BATCH = 200  # envelopes queued in one step, at most
BUFFER = 10_000  # envelopes read and not yet queued, at most
STOP_FLUSH_SECONDS = 5.0  # at stop, what was read is queued for at most this long
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # A Go gRPC server turns away a client that pings more often than every 5 minutes unless told
    # otherwise (GOAWAY "too_many_pings", which would end the stream and lose what comes meanwhile).
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 20_000),
]
STATES = {"connecting": 0, "live": 2, "stopped": 3}
# How often the state is told to the status page and `stats`, besides at each change: a quiet
# network sends nothing, and a listener that has not told for 2 minutes shows as not reporting.
REPORT_SECONDS = 10.0
KIND_OF_TOPIC = {topics.CONVERSATION: "group_message", topics.WELCOME: "welcome"}
_END = None  # put in the buffer once reading has ended


class NodeGoListener:
    def __init__(
        self,
        address: str,
        *,
        tls: bool,
        queue: WorkQueue,
        dependencies: DependencyLog,
        queues: bool,
        activity: ActivityLog | None = None,
    ) -> None:
        """`queues`: the envelopes are queued (the legacy API is on); otherwise only counted.
        `activity`: where the state is told for the status page and `stats`."""
        self.address, self.tls, self.queue, self.dependencies = address, tls, queue, dependencies
        self.queues, self.activity = queues, activity
        self._state = "connecting"
        self._changed = asyncio.Event()  # the state changed: tell it now
        self._delay_seconds = 0.0  # the last envelope's reading after the node stamped it
        self._buffer: asyncio.Queue[LegacyEnvelope | None] = asyncio.Queue(BUFFER)
        self._holding = 0  # envelopes read and not queued, outside the buffer
        self._ended = False  # `_END` is in the buffer
        self._counted = {
            kind: metrics.node_go_envelopes_total.labels(kind)
            for kind in ("group_message", "welcome", "other", "malformed")
        }
        # Whether the stream is open now (readiness), and whether the last attempts to open it failed
        # (told once, not at every retry).
        self._open = False
        self._reach = Reachability(log, NODE_GO_ADDRESS, "the node", "SubscribeAll")

    async def stream_open(self) -> bool:
        """Readiness: the SubscribeAll stream is open (the node answered it)."""
        return self._open

    async def run(self, stop: asyncio.Event) -> None:
        if not self.queues:
            log.warning(
                "%s is set and XMTP_PUSH_LEGACY_API_ENABLED is not: node-go envelopes are read and "
                "counted, not queued",
                NODE_GO_ADDRESS,
            )
        queuer = asyncio.create_task(self._queue_all())
        reporter = asyncio.create_task(self._report_until_stopped())
        try:
            await self._read_until(stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finish(queuer), STOP_FLUSH_SECONDS)
        finally:
            if not queuer.done():
                left = self._holding + self._buffer.qsize() - (1 if self._ended else 0)
                log.warning("%d node-go envelopes read were not queued before the listener stopped", left)
                queuer.cancel()
            reporter.cancel()
            await asyncio.gather(queuer, reporter, return_exceptions=True)
            self._enter("stopped")
            await self._report()

    # reading

    async def _read_until(self, stop: asyncio.Event) -> None:
        await keep_connected(stop, self._connect_once, metrics.node_go_reconnects_total)

    async def _connect_once(self, stop: asyncio.Event) -> bool:
        """One connection's life; True when the stream was open before it ended."""
        opened = False
        self._enter("connecting")
        try:
            async with self._channel() as channel:
                call = channel.unary_stream(
                    SUBSCRIBE_ALL,
                    request_serializer=node_go.SubscribeAllRequest.SerializeToString,
                    response_deserializer=_raw,  # read here, so an unreadable envelope is counted
                )(node_go.SubscribeAllRequest())
                watch = asyncio.create_task(stop.wait())
                watch.add_done_callback(lambda _: call.cancel())
                try:
                    # node-go sends its headers as it subscribes, before any envelope.
                    await call.wait_for_connection()
                    opened = self._open = True
                    self._reach.answered()
                    log.info("node-go stream open")
                    self._enter("live")
                    while (raw := await call.read()) is not _EOF:
                        await self._take(cast(bytes, raw), stop)
                    log.warning("the node-go stream was closed by the node; reconnecting")
                finally:
                    self._open = False
                    watch.cancel()
                    call.cancel()
        except grpc.aio.AioRpcError as error:
            if opened:
                log.warning("the node-go stream ended (%s); reconnecting", error.code().name)
            else:
                self._reach.failed(error.code())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the listener itself is being cancelled: never swallow that
            if not stop.is_set():
                log.warning("the node-go stream was cancelled; reconnecting")
        except Exception as error:
            tell_or_log(error, self.dependencies, RECONNECTS, log, "node-go listener connection failed")
        return opened

    def _channel(self) -> grpc.aio.Channel:
        return node_channel(self.address, tls=self.tls, options=CHANNEL_OPTIONS)

    async def _take(self, raw: bytes, stop: asyncio.Event) -> None:
        """Count one envelope by kind and buffer it when it is a group message or a welcome."""
        try:
            envelope = node_go.Envelope.FromString(raw)
        except DecodeError:
            self._counted["malformed"].inc()
            return
        topic = envelope.content_topic
        kind = KIND_OF_TOPIC.get(topics.message_kind(topic) or "", "other")
        self._counted[kind].inc()
        if kind == "other" or not self.queues:
            return
        self._delay_seconds = max(0.0, time.time() - envelope.timestamp_ns / 1e9)
        message = envelope.message
        key = idempotency_key(topic, message)
        await self._hold(LegacyEnvelope(topic, envelope.timestamp_ns, message, key), stop)

    async def _hold(self, envelope: LegacyEnvelope, stop: asyncio.Event) -> None:
        """Buffer the envelope, waiting for room while the queue refuses work (unless stopped)."""
        if not self._buffer.full():
            self._buffer.put_nowait(envelope)
            return
        put = asyncio.ensure_future(self._buffer.put(envelope))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({put, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not put.done():
            put.cancel()
            self._holding += 1  # read and never queued: told at stop

    def _enter(self, state: str) -> None:
        metrics.node_go_listener_state.set(STATES[state])
        if state != "stopped":
            metrics.dependency_up.labels("node_go").set(1 if state == "live" else 0)
        self._state = state
        self._changed.set()

    async def _report_until_stopped(self) -> None:
        while True:
            await self._report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REPORT_SECONDS)
            self._changed.clear()

    async def _report(self) -> None:
        if self.activity is None:
            return
        state = ListenerState(self._delay_seconds, time.time(), self._state)
        with contextlib.suppress(Exception):  # telemetry only
            await self.activity.set_listener(state, NODE_GO)

    # queueing

    async def _queue_all(self) -> None:
        """Queue what is read, a batch at a time, each until the queue takes it; ends at `_END`."""
        outage = Outage(log, "the node-go listener", self.dependencies)
        ended = False
        while not ended:
            batch, ended = await self._next_batch()
            self._holding += len(batch)
            while batch:
                try:
                    await enqueue_legacy(self.queue, batch)
                except Exception as error:
                    await asyncio.sleep(outage.failed(error))
                    continue
                outage.succeeded()
                self._holding -= len(batch)
                batch = []

    async def _next_batch(self) -> tuple[list[LegacyEnvelope], bool]:
        """The envelopes buffered (waiting for one), at most BATCH; and whether reading has ended."""
        batch: list[LegacyEnvelope] = []
        item = await self._buffer.get()
        while item is not _END:
            batch.append(item)
            if len(batch) >= BATCH or self._buffer.empty():
                return batch, False
            item = self._buffer.get_nowait()
        return batch, True

    async def _finish(self, queuer: asyncio.Task[None]) -> None:
        await self._buffer.put(_END)
        self._ended = True
        await asyncio.wait({queuer})  # (a timeout here leaves the queuer to the caller)


def _raw(data: bytes) -> bytes:
    return data


def new_node_go_listener(runtime: Runtime) -> NodeGoListener:
    settings = runtime.settings
    if runtime.queue is None or not settings.node_go_address:
        raise RuntimeError("the node-go listener needs a queue and XMTP_PUSH_NODE_GO_ADDRESS")
    return NodeGoListener(
        settings.node_go_address,
        tls=settings.node_go_tls,
        queue=runtime.queue,
        dependencies=runtime.dependencies,
        queues=settings.legacy_api_enabled,
        activity=runtime.activity,
    )


async def run_node_go_listener(runtime: Runtime, stop: asyncio.Event) -> None:
    await new_node_go_listener(runtime).run(stop)
