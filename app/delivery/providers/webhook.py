"""HTTPS webhook channel: Standard Webhooks signed pushes, posted with aiohttp.

Before every attempt the URL policy is checked again and the connection is
pinned to the addresses that passed it (app.delivery.pinned_http), through
XMTP_PUSH_WEBHOOK_PROXY when it is set (the environment's HTTPS_PROXY is for
provider traffic, not receivers').
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hmac
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus

import aiohttp

from app.core import metrics
from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.core.quota_settings import MAX_PER_FAST_HOST
from app.delivery.deadlines import Deadlines
from app.delivery.egress import DIRECT, EgressProxy
from app.delivery.health import ProviderHealth
from app.delivery.host_guard import Change, HostGuard
from app.delivery.pinned_http import TRANSIENT_ERRORS, PinnedSession, read_answer
from app.delivery.types import (
    DELIVERED,
    FAILED,
    REJECTED,
    Outcome,
    OutcomeKind,
    Push,
    WebhookExtras,
    deferred,
)
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
    (range(500, 600), FAILED),
)
# A timeout or a failed connection: transient, and counted against the host by its breaker (a
# host answering within the bound, whatever it answers, is reachable).
UNREACHABLE = Outcome(OutcomeKind.FAILED, reason="no answer (the connection failed)")
REFUSED = Outcome(OutcomeKind.FAILED, reason="connection refused")
TIMED_OUT = Outcome(
    OutcomeKind.FAILED, reason="timed out: no answer within XMTP_PUSH_PROVIDER_TIMEOUT_SECONDS"
)
CLOSED = Outcome(OutcomeKind.FAILED, reason="the receiver closed the connection without answering")
TLS_FAILED = Outcome(OutcomeKind.FAILED, reason="the TLS handshake failed (is its certificate trusted?)")
MAX_PER_HOST = 16
# What a status the receiver answered means, by status, then by class (the first digit).
STATUS_MEANINGS = {
    400: "the receiver refused the push (does it verify with the signing key registered?)",
    401: "the receiver refused the push's signature (is the signing key registered its key?)",
    403: "the receiver refused the push's signature (is the signing key registered its key?)",
    404: "the receiver says this webhook is gone",
    410: "the receiver says this webhook is gone",
}
CLASS_MEANINGS = {
    3: "redirects are not followed: register the final URL",
    4: "the receiver refused the push",
    5: "the receiver failed to take it (a transient failure: the pipeline retries it)",
}

log = logging.getLogger(__name__)


def outcome_for_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return DELIVERED
    return _described(status)


@functools.lru_cache(maxsize=1024)
def _described(status: int) -> Outcome:
    """A refusal's outcome with what the status means (one object per status, made once)."""
    return dataclasses.replace(_outcome_of(status), reason=status_meaning(status))


def _outcome_of(status: int) -> Outcome:
    if status in STATUS_OUTCOMES:
        return STATUS_OUTCOMES[status]
    for codes, outcome in RANGE_OUTCOMES:
        if status in codes:
            return outcome
    return REJECTED  # 3xx included: redirects are refused


@functools.lru_cache(maxsize=16)
def not_gone(status: int) -> Outcome:
    """A 404 or 410 from an endpoint that cannot be gone: refused, with what the status is."""
    return dataclasses.replace(REJECTED, reason=_status_name(status))


def status_meaning(status: int) -> str:
    name = _status_name(status)
    meaning = STATUS_MEANINGS.get(status) or CLASS_MEANINGS.get(status // 100)
    return f"{name}: {meaning}" if meaning else name


def _status_name(status: int) -> str:
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def unanswered(error: BaseException) -> Outcome:
    """What a post that got no answer met (all transient, and counted against the host)."""
    if isinstance(error, aiohttp.ClientSSLError):
        return TLS_FAILED
    cause = getattr(error, "os_error", None) or error.__cause__ or error
    if isinstance(cause, ConnectionRefusedError):
        return REFUSED
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return TIMED_OUT
    if isinstance(error, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return CLOSED
    return UNREACHABLE


UNSIGNED_HEADERS = {"content-type": "application/json"}


def request_headers(extras: WebhookExtras, message_id: str | None, body: bytes) -> dict[str, str]:
    """The headers of a post: signed when the push has a key (its id is then set), plus its own."""
    key = extras.signing_key
    if key is None or message_id is None:
        headers = dict(UNSIGNED_HEADERS)
    else:
        headers = signed_headers(key, message_id, int(time.time()), body)
    if extras.headers:
        headers.update(extras.headers)
    return headers


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
    proxy: EgressProxy = DIRECT  # XMTP_PUSH_WEBHOOK_PROXY
    # Whether a 404 or 410 says the webhook is gone (a receiver registered by a client). False for
    # an endpoint of the deployment's own configuration, which no answer removes: they are refusals.
    gone_is_dead: bool = True
    # Attempts in flight to a host once it has shown itself fast (XMTP_PUSH_WEBHOOK_MAX_PER_FAST_HOST).
    max_per_fast_host: int = MAX_PER_FAST_HOST


class WebhookProvider:
    channel = Channel.HTTP

    def __init__(
        self,
        policy: UrlPolicy,
        timeout_seconds: float,
        max_connections: int = 512,
        *,
        max_per_host: int = MAX_PER_HOST,
        max_per_fast_host: int = MAX_PER_FAST_HOST,
        app: AppName = DEFAULT_APP,
        proxy: EgressProxy = DIRECT,
        gone_is_dead: bool = True,
    ) -> None:
        self.app = app
        self._policy = policy
        self._gone_is_dead = gone_is_dead
        self._hosts = HostGuard(max_per_host, max_fast_in_flight=max_per_fast_host)
        self._lookups = SharedLookups()
        # Each post is bounded by one shared sweep rather than by aiohttp's timer per request.
        self._deadlines = Deadlines(timeout_seconds)
        # Receivers' own keys sign nothing of ours: there are no credentials to judge.
        self._health = ProviderHealth(self.channel, app, credentials=False)
        self._session = PinnedSession(max_connections, self._health.connected, proxy)

    @classmethod
    def from_config(
        cls,
        config: WebhookConfig,
        timeout_seconds: float,
        *,
        app: AppName = DEFAULT_APP,
        proxy: EgressProxy = DIRECT,
    ) -> WebhookProvider:
        """`proxy` (the providers') is not the receivers': they follow the config's own."""
        return cls(
            config.policy,
            timeout_seconds,
            max_per_host=config.max_per_host,
            max_per_fast_host=config.max_per_fast_host,
            app=app,
            proxy=config.proxy,
            gone_is_dead=config.gone_is_dead,
        )

    async def send(self, push: Push) -> Outcome:
        body, extras, message_id = push.payload, push.extras, push.message_id
        if not isinstance(extras, WebhookExtras) or not isinstance(body, bytes):
            return REJECTED
        if extras.signing_key is not None and message_id is None:  # nothing to sign as webhook-id
            return REJECTED
        try:
            checked = await check_webhook_url(push.address, self._policy, self._lookups)
        except UrlNotResolved:
            return FAILED
        except UrlNotAllowed:
            return REJECTED
        destination = checked.target.destination
        wait = self._hosts.admit(destination)
        if wait is not None:  # a parked host's pushes may be replaced while they wait; a busy one's not
            return deferred(wait, replaceable=self._hosts.is_parked(destination))
        outcome, answered, started = UNREACHABLE, False, time.monotonic()
        headers = request_headers(extras, message_id, body)
        # Posted here rather than in a helper coroutine: one frame less to build and resume per attempt.
        try:
            with self._deadlines.bound():
                async with self._session.post(checked, body, headers) as response:
                    await read_answer(response)
                    outcome, answered = outcome_for_status(response.status), True
            if outcome.kind is OutcomeKind.DEAD and not self._gone_is_dead:
                outcome = not_gone(response.status)
        except TRANSIENT_ERRORS as error:
            outcome = unanswered(error)
        except aiohttp.ClientError:
            outcome, answered = REJECTED, True
        finally:
            took = time.monotonic() - started
            change = self._hosts.release(destination, unreachable=not answered, seconds=took)
            if change is not None:
                self._tell(change)
        return outcome

    def _tell(self, change: Change) -> None:
        """Once per change of a host's state, with the count of hosts parked; never the host."""
        parked = self._hosts.parked()
        if change is Change.PARKED:
            log.warning(
                "a webhook host is parked after repeated timeouts or refused connections (%d parked)", parked
            )
        else:
            log.info("a parked webhook host answers again (%d parked)", parked)

    def sample_gauges(self) -> None:
        metrics.webhook_parked_hosts.set(self._hosts.parked())
        self._health.connections(*self._session.counts())

    async def close(self) -> None:
        await self._session.close()
        await self._deadlines.close()
