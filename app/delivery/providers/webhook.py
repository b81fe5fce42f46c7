"""HTTPS webhook channel: Standard Webhooks signed pushes, posted with aiohttp.

Before every attempt the URL policy is checked again and the connection is
pinned to the addresses that passed it (app.delivery.pinned_http).
"""

from __future__ import annotations

import base64
import hmac
import logging
import time
from dataclasses import dataclass

import aiohttp

from app.core import metrics
from app.delivery.deadlines import Deadlines
from app.delivery.health import ProviderHealth
from app.delivery.host_guard import HostGuard
from app.delivery.pinned_http import TRANSIENT_ERRORS, connection_counts, pin, pinned_session, read_answer
from app.delivery.provider import DEFAULT_APP
from app.delivery.types import DELIVERED, REJECTED, TRANSIENT, Outcome, OutcomeKind, Push, deferred
from app.delivery.url_policy import (
    SharedLookups,
    UrlNotAllowed,
    UrlNotResolved,
    UrlPolicy,
    check_webhook_url,
)

GONE = Outcome(OutcomeKind.DEAD, confirm_by_retry=True)
# Status -> outcome. Ranges are checked after exact codes.
STATUS_OUTCOMES: dict[int, Outcome] = {404: GONE, 410: GONE}
RANGE_OUTCOMES: tuple[tuple[range, Outcome], ...] = (
    (range(200, 300), DELIVERED),
    (range(500, 600), TRANSIENT),
)
# A timeout or a failed connection: transient, and counted against the host by its breaker (a
# host answering within the bound, whatever it answers, is reachable).
UNREACHABLE = Outcome(OutcomeKind.TRANSIENT)
MAX_PER_HOST = 16

log = logging.getLogger(__name__)


def outcome_for_status(status: int) -> Outcome:
    if status in STATUS_OUTCOMES:
        return STATUS_OUTCOMES[status]
    for codes, outcome in RANGE_OUTCOMES:
        if status in codes:
            return outcome
    return REJECTED  # 3xx included: redirects are refused


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Standard Webhooks headers. The signature is computed here rather than by
    `standardwebhooks.Webhook(key).sign`, which builds a Webhook, a datetime and an HMAC object
    on every call; the bytes are the library's (the tests compare them on random inputs)."""
    stamp = str(timestamp)
    mac = hmac.digest(key, b"%b.%b.%b" % (message_id.encode(), stamp.encode(), body), "sha256")
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": stamp,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """The webhook channel's configuration: which URLs may be called, and how many attempts may
    be in flight to one host."""

    policy: UrlPolicy
    max_per_host: int = MAX_PER_HOST


class WebhookProvider:
    channel = "http"

    def __init__(
        self,
        policy: UrlPolicy,
        timeout_seconds: float,
        max_connections: int = 512,
        *,
        max_per_host: int = MAX_PER_HOST,
        app: str = DEFAULT_APP,
    ) -> None:
        self.app = app
        self._policy = policy
        self._hosts = HostGuard(max_per_host)
        self._lookups = SharedLookups()
        # Each post is bounded by one shared sweep rather than by aiohttp's timer per request.
        self._deadlines = Deadlines(timeout_seconds)
        # Receivers' own keys sign nothing of ours: there are no credentials to judge.
        self._health = ProviderHealth(self.channel, app, credentials=False)
        self._session = pinned_session(max_connections, self._health.connected)

    @classmethod
    def from_config(
        cls, config: WebhookConfig, timeout_seconds: float, *, app: str = DEFAULT_APP
    ) -> WebhookProvider:
        return cls(config.policy, timeout_seconds, max_per_host=config.max_per_host, app=app)

    async def send(self, push: Push) -> Outcome:
        body, key, message_id = push.payload, push.signing_key, push.message_id
        if not key or message_id is None or not isinstance(body, bytes):
            return REJECTED
        try:
            checked = await check_webhook_url(push.address, self._policy, self._lookups)
        except UrlNotResolved:
            return TRANSIENT
        except UrlNotAllowed:
            return REJECTED
        destination = checked.target.destination
        wait = self._hosts.admit(destination)
        if wait is not None:  # a parked host's pushes may be replaced while they wait; a busy one's not
            return deferred(wait, replaceable=self._hosts.is_parked(destination))
        outcome, started = UNREACHABLE, time.monotonic()
        pin(checked)
        headers = signed_headers(key, message_id, int(time.time()), body)
        # Posted here rather than in a helper coroutine: one frame less to build and resume per attempt.
        try:
            with self._deadlines.bound():
                async with self._session.post(
                    push.address, data=body, headers=headers, allow_redirects=False
                ) as response:
                    await read_answer(response)
                    outcome = outcome_for_status(response.status)
        except TRANSIENT_ERRORS:
            outcome = UNREACHABLE
        except aiohttp.ClientError:
            outcome = REJECTED
        finally:
            took = time.monotonic() - started
            if self._hosts.release(destination, unreachable=outcome is UNREACHABLE, seconds=took):
                log.warning("a webhook host is parked after repeated timeouts or refused connections")
        return outcome

    def sample_gauges(self) -> None:
        metrics.webhook_parked_hosts.set(self._hosts.parked())
        self._health.connections(*connection_counts(self._session))

    async def close(self) -> None:
        await self._session.close()
        await self._deadlines.close()
