"""The three quotas of docs/callers.md#quotas-per-caller: calls and topic changes per caller, and the
recipients and installations created by all callers together. A call over a quota changes nothing
and is answered UNAVAILABLE (errors.Throttled): the SDK retries that with backoff, where
RESOURCE_EXHAUSTED would stop its additions until the app's wanted set changes.

Each refusal counts in `xmtp_push_throttled_total{quota}`; one WARNING per quota when throttling
starts and one when it has stopped (no refusal for QUIET_SECONDS), with counts, never the caller.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.core.config import ENV_PREFIX, Settings
from app.core.errors import Throttled
from app.core.metrics import throttled_total
from app.queue.redis_link import RedisLink
from app.quotas.buckets import Buckets, Charge, LocalBuckets, RedisBuckets
from app.quotas.callers import caller_digest

log = logging.getLogger(__name__)
CALLS, TOPIC_CHANGES, NEW_RECIPIENTS = "calls", "topic_changes", "new_recipients"
SETTINGS = {
    CALLS: f"{ENV_PREFIX}CALLER_CALLS_PER_MINUTE",
    TOPIC_CHANGES: f"{ENV_PREFIX}CALLER_TOPIC_CHANGES_PER_MINUTE",
    NEW_RECIPIENTS: f"{ENV_PREFIX}NEW_RECIPIENTS_PER_MINUTE",
}
# Throttling has stopped once a quota has refused nothing for this long.
QUIET_SECONDS = 60.0
NEW_RECIPIENTS_KEY = "xmtp-push:quota:{new-recipients}"
UNLIMITED_CALLERS = (
    "anyone who reaches this address may register without limit: set XMTP_PUSH_CALLER_CALLS_PER_MINUTE"
)


class _Throttling:
    """One quota's state for its log lines: refusing or not, and how many since it started."""

    def __init__(self, quota: str, clock: Callable[[], float]) -> None:
        self.quota, self._clock = quota, clock
        self._counter = throttled_total.labels(quota)
        self.refused = 0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def refusal(self) -> None:
        self._counter.inc()
        self._last = self._clock()
        self.refused += 1
        if self.refused == 1:
            log.warning("quota %s: throttling callers over %s", self.quota, SETTINGS[self.quota])
            self._timer = asyncio.get_running_loop().call_later(QUIET_SECONDS, self._check)

    def _check(self) -> None:
        quiet_for = self._clock() - self._last
        if quiet_for < QUIET_SECONDS:
            self._timer = asyncio.get_running_loop().call_later(QUIET_SECONDS - quiet_for, self._check)
            return
        log.warning("quota %s: throttling stopped (%d calls refused)", self.quota, self.refused)
        self.refused, self._timer = 0, None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@dataclass(frozen=True, slots=True)
class Limits:
    calls: int  # per caller per minute; 0: off
    topic_changes: int  # per caller per minute; 0: off
    new_recipients: int  # all callers per minute; 0: off


class Quotas:
    def __init__(self, limits: Limits, buckets: Buckets, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._buckets = limits, buckets
        self._throttling = {quota: _Throttling(quota, clock) for quota in SETTINGS}

    @classmethod
    def from_settings(cls, settings: Settings, link: RedisLink | None) -> Quotas | None:
        """The process's quotas (shared through Redis when `link`), or None when all are off."""
        limits = Limits(
            settings.caller_calls_per_minute,
            settings.caller_topic_changes_per_minute,
            settings.new_recipients_per_minute,
        )
        if not (limits.calls or limits.topic_changes or limits.new_recipients):
            return None
        local = LocalBuckets()
        return cls(limits, RedisBuckets(link, local) if link is not None else local)

    @property
    def per_caller(self) -> bool:
        """Whether a call's caller is counted (else only what all callers create together is)."""
        return bool(self.limits.calls or self.limits.topic_changes)

    async def admit(self, caller: str, topic_changes: int) -> None:
        """Charge one call of `caller` (an identity of app.quotas.callers), with its topic changes;
        Throttled when a quota refuses (the calls token stays spent when topic changes refuse)."""
        digest = caller_digest(caller)
        charges, quotas = [], []
        if self.limits.calls:
            charges.append(Charge(f"xmtp-push:quota:{{{digest}}}:calls", self.limits.calls, 1))
            quotas.append(CALLS)
        if self.limits.topic_changes and topic_changes:
            key = f"xmtp-push:quota:{{{digest}}}:topic-changes"
            charges.append(Charge(key, self.limits.topic_changes, topic_changes))
            quotas.append(TOPIC_CHANGES)
        if not charges:
            return
        refused = await self._buckets.charge(charges)
        if refused is not None:
            self._throttling[quotas[refused.index]].refusal()
            raise Throttled(refused.retry_after_seconds)

    async def created(self, count: int) -> None:
        """app.core.growth.Growth: `count` recipients or installations created by a call."""
        if not self.limits.new_recipients or count <= 0:
            return
        refused = await self._buckets.charge([Charge(NEW_RECIPIENTS_KEY, self.limits.new_recipients, count)])
        if refused is not None:
            self._throttling[NEW_RECIPIENTS].refusal()
            raise Throttled(refused.retry_after_seconds)

    def close(self) -> None:
        for throttling in self._throttling.values():
            throttling.close()


def unlimited_callers_warning(settings: Settings) -> str | None:
    """The contract's warning when the API listens beyond loopback with the calls quota off."""
    if settings.caller_calls_per_minute:
        return None
    if all(_is_loopback(host) for host in (settings.http_host, settings.grpc_host)):
        return None
    return UNLIMITED_CALLERS


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
