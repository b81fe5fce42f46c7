"""APNs channel: pushes over HTTP/2 with token auth, through aioapns.

aioapns (pinned to 4.0) signs a new JWT for every connection; Apple refuses such
churn with TooManyProviderTokenUpdates, so one token is shared by the pool's
connections and renewed before it is an hour old (or when Apple says it
expired: once per expiry, however many answers said so). aioapns also has no
timeout of its own, and retries with sleeps; each send is bounded here and gets
a single attempt, retries go through our queue. The connection and pool
adjustments are in apns_connection.
"""

from __future__ import annotations

import functools
import ssl
import time
from dataclasses import replace
from typing import Any

import jwt
from aioapns.common import NotificationRequest, PushType
from aioapns.connection import AuthorizationHeaderProvider
from aioapns.exceptions import ConnectionClosed, ConnectionError, MaxAttemptsExceeded

from app.core import metrics
from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.core.ids import UuidSequence
from app.delivery.causes import TIMEOUT, connection_cause, credentials_refused, http_cause
from app.delivery.credentials import ApnsCredentials
from app.delivery.deadlines import Deadlines
from app.delivery.egress import DIRECT, EgressProxy
from app.delivery.health import ProviderHealth
from app.delivery.providers.apns_connection import EndpointPool
from app.delivery.types import (
    DEAD,
    DELIVERED,
    FAILED,
    MISMATCH,
    REJECTED,
    ApnsExtras,
    Outcome,
    Priority,
    Push,
    PushKind,
)

MAX_BODY_BYTES = 4096
MAX_COLLAPSE_ID_BYTES = 64
TOKEN_REFRESH_SECONDS = 50 * 60  # Apple accepts a token for 60 minutes
# Apple requires priority 5 for background pushes; an alert goes at 10 when it is urgent.
NORMAL_PRIORITY, HIGH_PRIORITY = 5, 10
PUSH_TYPES = {kind: PushType(kind.value) for kind in PushKind}
EXPIRED_PROVIDER_TOKEN = "ExpiredProviderToken"
# Every 403 is about the provider token or its key (InvalidProviderToken, ExpiredProviderToken once
# renewed, MissingProviderToken, Forbidden...): the credentials, not the push.
CREDENTIALS_REFUSED = "403"
# (status, reason) -> outcome; (status, None) matches any reason for that status.
OUTCOMES: dict[tuple[str, str | None], Outcome] = {
    ("200", None): DELIVERED,
    ("410", None): DEAD,  # Unregistered, ExpiredToken
    ("400", "BadDeviceToken"): MISMATCH,
    ("400", "DeviceTokenNotForTopic"): MISMATCH,
    ("400", "TopicDisallowed"): MISMATCH,  # the token's app may not be pushed with this apns-topic
    ("429", None): FAILED,
    ("500", None): FAILED,
    ("503", None): FAILED,
}
CONNECTION_ERRORS = (ConnectionClosed, ConnectionError, MaxAttemptsExceeded, OSError, ssl.SSLError)


def outcome_for(status: str, reason: str | None) -> Outcome:
    outcome = OUTCOMES.get((status, reason)) or OUTCOMES.get((status, None)) or REJECTED
    return outcome if outcome is DELIVERED else _told(outcome, http_cause(status, reason))


@functools.lru_cache(maxsize=256)
def _told(outcome: Outcome, cause: str) -> Outcome:
    """`outcome` saying what happened (one object per answer and cause, made once)."""
    return replace(outcome, reason=cause)


class SharedToken(AuthorizationHeaderProvider):
    """One provider token for every connection of a credential, renewed before it expires."""

    def __init__(self, key_pem: str, key_id: str, team_id: str, clock: Any = time.time) -> None:
        self._key, self._key_id, self._team_id, self._clock = key_pem, key_id, team_id, clock
        self._header: str | None = None
        self._issued_at = 0.0

    def get_header(self) -> str:
        if self._header is None or self._clock() - self._issued_at >= TOKEN_REFRESH_SECONDS:
            self._issued_at = int(self._clock())
            token = jwt.encode(
                {"iss": self._team_id, "iat": int(self._issued_at)},
                self._key,
                algorithm="ES256",
                headers={"kid": self._key_id},
            )
            self._header = f"bearer {token}"
        return self._header

    def age(self) -> float:
        """Seconds since the token in use was signed; 0 before the first."""
        return 0.0 if self._header is None else max(0.0, self._clock() - self._issued_at)

    def renew(self, rejected: str) -> None:
        """Apple refused `rejected` as expired (clock skew, long idle): sign a new one next time,
        unless another request already did, so a burst of such answers renews it once."""
        if self._header == rejected:
            self._header = None


class ApnsProvider:
    channel = Channel.APNS

    def __init__(
        self,
        credentials: ApnsCredentials,
        timeout_seconds: float,
        max_connections: int = 4,
        *,
        app: AppName = DEFAULT_APP,
        proxy: EgressProxy = DIRECT,
    ) -> None:
        self.app = app
        self._health = ProviderHealth(self.channel, app)
        self._token_age = metrics.apns_token_age_seconds.labels(app.label)
        self._token: SharedToken | None = None
        if credentials.cert_file is None:
            self._token = SharedToken(credentials.key_pem, credentials.key_id, credentials.team_id)
        tunnel = proxy.for_url(credentials.endpoint)
        self._pool = EndpointPool(credentials, self._token, max_connections, self._health.connected, tunnel)
        self._deadlines = Deadlines(timeout_seconds)
        self._ids = UuidSequence()  # apns-id values

    async def send(self, push: Push) -> Outcome:
        request = apns_request(push, self._ids.next())
        if request is None:
            return REJECTED
        token = self._token
        presented = token.get_header() if token else ""  # what this attempt sends, unless renewed meanwhile
        status, reason = await self._attempt(request)
        if token is not None and status == "403" and reason == EXPIRED_PROVIDER_TOKEN:
            token.renew(presented)
            status, reason = await self._attempt(apns_request(push, self._ids.next()))  # type: ignore[arg-type]
        if status is None:  # no answer: `reason` is what the connection met
            return _told(FAILED, reason or "no answer")
        if status == CREDENTIALS_REFUSED:
            self._health.refused()
            cause = credentials_refused(http_cause(status, reason))
            return _told(replace(outcome_for(status, reason), credentials_refused=True), cause)
        self._health.accepted()
        return outcome_for(status, reason)

    def sample_gauges(self) -> None:
        connections = self._pool.connections
        # A connection carries a request while aioapns holds an answer pending on it.
        self._health.connections(len(connections), sum(1 for c in connections if c.requests))
        if self._token is not None:  # none with certificate auth
            self._token_age.set(self._token.age())

    async def _attempt(self, request: NotificationRequest) -> tuple[str | None, str | None]:
        """(status, APNs's reason) of an answer; (None, what the connection met) without one."""
        try:
            # A shared sweep, not asyncio.timeout or wait_for: no timer or task per send.
            with self._deadlines.bound():
                result = await self._pool.send_notification(request)
        except TimeoutError:
            return None, TIMEOUT
        except CONNECTION_ERRORS as error:
            # aioapns raises its own error when a connection cannot be made, the cause dropped: the
            # pool keeps the last one.
            return None, connection_cause(self._pool.connect_error or error)
        return str(result.status), result.description

    async def close(self) -> None:
        self._pool.close()
        await self._deadlines.close()


def apns_request(push: Push, request_id: str) -> NotificationRequest | None:
    """The request for a push (its apns-id `request_id`), or None when Apple would refuse it for
    its size."""
    body, collapse_id = push.payload, push.collapse_id
    if not isinstance(body, bytes) or len(body) > MAX_BODY_BYTES:
        return None
    if collapse_id is not None and len(collapse_id.encode()) > MAX_COLLAPSE_ID_BYTES:
        return None
    background = push.kind is PushKind.BACKGROUND
    urgent = push.priority is Priority.HIGH and not background
    extras = push.extras if isinstance(push.extras, ApnsExtras) else None
    return NotificationRequest(
        device_token=push.address,
        notification_id=request_id,
        message=body,  # type: ignore[arg-type]  # sent as it is (see apns_connection)
        time_to_live=None if push.expires_at is None else max(0, push.expires_at - int(time.time())),
        priority=HIGH_PRIORITY if urgent else NORMAL_PRIORITY,
        push_type=_push_type(push, extras),
        collapse_key=collapse_id,
        apns_topic=extras.apns_topic if extras else None,
    )


def _push_type(push: Push, extras: ApnsExtras | None) -> PushType | None:
    """The apns-push-type header's value; None leaves the header out of the request."""
    if extras is not None and extras.push_type:
        return PushType(extras.push_type)
    if extras is not None and not extras.push_type_from_kind:
        return None
    return PUSH_TYPES[push.kind]
