"""One notify request: each device routed to its app, rendered, sent, and the answer made.

The devices of a request are sent concurrently, and the whole request is answered within the
configured timeout: a transient failure is tried again only while the time left allows (its
Retry-After, else a short backoff; an FCM quota answer as Sygnal tries it: its Retry-After, else
60 s doubling, three tries in all), otherwise the request is answered 502 and the homeserver's
own backoff takes over. Each app has its own provider (its own connections) and its own bound on
devices in flight, so a hung or failing app fills only its own share and answers 502 at once past
it, while other apps keep answering. A pushkey is rejected only for a fault that is permanent
and the token's (or the device's own request: unknown app, unusable pushkey or pusher data). Why an
app's pushes fail is logged once per change (app.matrix.causes).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from app.core.metrics import matrix_devices_total
from app.delivery.deadlines import Deadlines
from app.delivery.provider import Provider
from app.delivery.registry import ProviderRegistry
from app.delivery.retry import RetryPolicy
from app.delivery.types import Outcome, OutcomeKind, Push
from app.matrix.apps import AppTable, MatrixApp, RejectDevice
from app.matrix.causes import NO_ANSWER, NO_PROVIDER, FailureCauses, cause_of
from app.matrix.config import MAX_APP_ID_LENGTH
from app.matrix.duplicates import DeliveredMemory, delivery_key
from app.matrix.notification import Device, Notification

MAX_PUSHKEY_BYTES = 512
# The gateway's own retry numbers, Sygnal's: a Retry-After that fits the deadline as given, quota
# answers backing off from 60 s, nothing past the deadline. The XMTP workers' policies (a floor under
# FCM's 5xx, an hour's window) are for pushes queued for later, not for a homeserver waiting on us.
IN_REQUEST_RETRY = RetryPolicy()
# A retry is made only if this much time is left for it after its wait.
MIN_ATTEMPT_SECONDS = 1.0
# How late a request's deadline may be noticed (one sweep for every request, not a timer each).
SWEEP_SECONDS = 0.02
# Kept back from the timeout for answering, and for the sweep's lateness.
ANSWER_MARGIN_SECONDS = 0.05 + SWEEP_SECONDS
NO_APP = "none"  # the app label of a device whose app id no app serves

log = logging.getLogger(__name__)


class DeviceResult(enum.Enum):
    DELIVERED = "delivered"
    REJECTED = "rejected"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    LIMITED = "limited"  # past its app's in-flight limit: not attempted


@dataclass(frozen=True, slots=True)
class NotifyAnswer:
    status: int  # 200, or 502 when a device failed for a reason that is not its token's
    rejected: list[str]  # pushkeys exactly as the homeserver sent them


class Gateway:
    def __init__(
        self, apps: AppTable, providers: ProviderRegistry, memory: DeliveredMemory, timeout_seconds: float
    ) -> None:
        self.apps, self.providers, self.memory = apps, providers, memory
        self.timeout_seconds = timeout_seconds
        self._inflight: Counter[str] = Counter()
        self.deadlines = Deadlines(timeout_seconds, period=SWEEP_SECONDS)
        # Each (app, result) counter child looked up once: a label lookup per device adds up.
        self._counted: dict[tuple[str, DeviceResult], Any] = {}
        self.causes = FailureCauses()

    async def providers_ready(self) -> bool:
        """Every app has its provider built (readiness of `xmtp-push gateway`)."""
        return all(self.providers.get(app.channel, app.provider_app) for app in self.apps.apps)

    async def notify(self, notification: Notification, arrived_at: float | None = None) -> NotifyAnswer:
        """`arrived_at`: time.monotonic() when the request arrived (its body read since counts
        against the same timeout); now when not given."""
        deadline = (arrived_at or time.monotonic()) + self.timeout_seconds - ANSWER_MARGIN_SECONDS
        devices = notification.devices
        if len(devices) == 1:  # what homeservers send: no task per device
            results = [await self._device(notification, devices[0], deadline)]
        else:
            results = await asyncio.gather(*(self._device(notification, d, deadline) for d in devices))
        rejected = [d.pushkey for d, r in zip(devices, results, strict=True) if r is DeviceResult.REJECTED]
        failed = any(r is DeviceResult.FAILED or r is DeviceResult.LIMITED for r in results)
        return NotifyAnswer(502 if failed else 200, rejected)

    async def _device(self, notification: Notification, device: Device, deadline: float) -> DeviceResult:
        app = self._app_for(device)
        label = app.app_id if app is not None else NO_APP
        try:
            if app is None:
                raise RejectDevice("no app serves its app id, or two do")
            result = await self._deliver(app, notification, device, deadline)
        except RejectDevice as reason:
            log.info("matrix device rejected (app %s): %s", label, reason)
            result = DeviceResult.REJECTED
        self._count(label, result)
        return result

    def _count(self, label: str, result: DeviceResult) -> None:
        counter = self._counted.get((label, result))
        if counter is None:
            counter = self._counted[(label, result)] = matrix_devices_total.labels(label, result.value)
        counter.inc()

    def _app_for(self, device: Device) -> MatrixApp | None:
        if len(device.app_id) > MAX_APP_ID_LENGTH:
            return None
        return self.apps.find(device.app_id)

    async def _deliver(
        self, app: MatrixApp, notification: Notification, device: Device, deadline: float
    ) -> DeviceResult:
        push = _render(app, notification, device)
        if push is None:
            return DeviceResult.DELIVERED  # nothing to show: done, as Sygnal
        key = (
            delivery_key(device.app_id, device.pushkey, notification.event_id)
            if notification.event_id
            else None
        )
        if key is not None and await self.memory.delivered(key):
            return DeviceResult.DUPLICATE
        if self._inflight[app.app_id] >= app.inflight_request_limit:
            self.causes.failed(app.app_id, f"in-flight limit of {app.inflight_request_limit} reached")
            return DeviceResult.LIMITED
        self._inflight[app.app_id] += 1
        try:
            result = await self._send(app, push, deadline)
        finally:
            self._inflight[app.app_id] -= 1
        if result is DeviceResult.DELIVERED and key is not None:
            await self.memory.remember(key)
        return result

    async def _send(self, app: MatrixApp, push: Push, deadline: float) -> DeviceResult:
        provider = self.providers.get(app.channel, app.provider_app)
        if provider is None:
            self.causes.failed(app.app_id, NO_PROVIDER)
            return DeviceResult.FAILED
        retry = IN_REQUEST_RETRY
        for attempt in range(retry.in_request_attempts):
            outcome = await self._attempt(provider, push, deadline)
            if outcome is None or not _retried(outcome.kind):
                return self._result(app, outcome)
            cause = cause_of(outcome)
            wait = retry.in_request_wait(outcome, attempt)
            if wait is None or time.monotonic() + wait + MIN_ATTEMPT_SECONDS > deadline:
                break
            await asyncio.sleep(wait)
        self.causes.failed(app.app_id, cause)  # retries out of the request's time
        return DeviceResult.FAILED

    def _result(self, app: MatrixApp, outcome: Outcome | None) -> DeviceResult:
        if outcome is None:
            self.causes.failed(app.app_id, NO_ANSWER)
            return DeviceResult.FAILED
        if outcome.kind is OutcomeKind.DELIVERED:
            self.causes.delivered(app.app_id)
            return DeviceResult.DELIVERED
        if outcome.kind in app.rejecting:
            log.info("matrix app %s: a pushkey is rejected: %s", app.app_id, cause_of(outcome))
            return DeviceResult.REJECTED
        self.causes.failed(app.app_id, cause_of(outcome))
        return DeviceResult.FAILED

    async def _attempt(self, provider: Provider, push: Push, deadline: float) -> Outcome | None:
        """One attempt within the request's deadline; None when the deadline came first."""
        try:
            with self.deadlines.bound(until=deadline):
                return await provider.send(push)
        except TimeoutError:
            return None

    async def close(self) -> None:
        await self.deadlines.close()


def _render(app: MatrixApp, notification: Notification, device: Device) -> Push | None:
    if len(device.pushkey.encode()) > MAX_PUSHKEY_BYTES:
        raise RejectDevice(f"pushkey over {MAX_PUSHKEY_BYTES} bytes")
    default_payload: Any = device.data.get("default_payload", {})
    if not isinstance(default_payload, dict):
        raise RejectDevice("the pusher's default_payload is not an object")
    return app.render(notification, device)


def _retried(kind: OutcomeKind) -> bool:
    # Identity tests: an enum's hash is a Python-level call, once per device adds up.
    return kind is OutcomeKind.FAILED or kind is OutcomeKind.DEFERRED
