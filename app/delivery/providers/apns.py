"""APNs channel: background hints over HTTP/2 with token auth, through aioapns.

aioapns (pinned to 4.0) needs three adjustments, all kept in this module:
- it signs a new JWT for every connection; Apple refuses such churn with
  TooManyProviderTokenUpdates, so one token is shared by the pool's
  connections and renewed before it is an hour old (or when Apple says it
  expired);
- its host is a class attribute; a protocol subclass carries the configured
  endpoint (a staging relay or a local simulator) and port;
- it has no timeout of its own, and retries with sleeps; each send is bounded
  here and gets a single attempt, retries go through our queue.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import jwt
from aioapns.common import NotificationRequest, PushType
from aioapns.connection import (
    APNsBaseClientProtocol,
    APNsKeyConnectionPool,
    APNsTLSClientProtocol,
    AuthorizationHeaderProvider,
)
from aioapns.exceptions import ConnectionClosed, ConnectionError, MaxAttemptsExceeded

from app.delivery.credentials import ApnsCredentials
from app.delivery.types import DEAD, DELIVERED, MISMATCH, REJECTED, TRANSIENT, Hint, Outcome, Target

MAX_BODY_BYTES = 4096
MAX_COLLAPSE_ID_BYTES = 64
TOKEN_REFRESH_SECONDS = 50 * 60  # Apple accepts a token for 60 minutes
BACKGROUND_PRIORITY = 5
EXPIRED_PROVIDER_TOKEN = "ExpiredProviderToken"
# (status, reason) -> outcome; (status, None) matches any reason for that status.
OUTCOMES: dict[tuple[str, str | None], Outcome] = {
    ("200", None): DELIVERED,
    ("410", None): DEAD,  # Unregistered, ExpiredToken
    ("400", "BadDeviceToken"): MISMATCH,
    ("400", "DeviceTokenNotForTopic"): MISMATCH,
    ("429", None): TRANSIENT,
    ("500", None): TRANSIENT,
    ("503", None): TRANSIENT,
}
CONNECTION_ERRORS = (ConnectionClosed, ConnectionError, MaxAttemptsExceeded, OSError, ssl.SSLError)


def outcome_for(status: str, reason: str | None) -> Outcome:
    return OUTCOMES.get((status, reason)) or OUTCOMES.get((status, None)) or REJECTED


def apns_body(hint: Hint) -> dict[str, Any]:
    return {
        "aps": {"content-available": 1},
        "topic": base64.b64encode(hint.topic).decode(),
        "sequence_id": str(hint.sequence_id),
    }


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

    def renew(self) -> None:
        """Apple said the token expired (clock skew, long idle): sign a new one next time."""
        self._header = None


class _EndpointPool(APNsKeyConnectionPool):
    def __init__(self, credentials: ApnsCredentials, token: SharedToken, max_connections: int) -> None:
        parts = urlsplit(credentials.endpoint)
        context = ssl.create_default_context(cafile=credentials.ca_file) if credentials.ca_file else None
        super().__init__(
            key=credentials.key_pem,
            key_id=credentials.key_id,
            team_id=credentials.team_id,
            topic=credentials.bundle_id,
            max_connections=max_connections,
            max_connection_attempts=1,
            ssl_context=context,
        )
        self.protocol_class = type(
            "EndpointProtocol",
            (APNsTLSClientProtocol,),
            {"APNS_SERVER": parts.hostname, "APNS_PORT": parts.port or 443},
        )
        self._token = token

    async def create_connection(self) -> APNsBaseClientProtocol:
        factory = partial(self.protocol_class, self.apns_topic, self.loop, self.discard_connection, self._token)
        return await self._create_connection(factory)  # type: ignore[no-untyped-call]


class ApnsProvider:
    channel_label = "apns"

    def __init__(self, credentials: ApnsCredentials, timeout_seconds: float, max_connections: int = 4) -> None:
        self._token = SharedToken(credentials.key_pem, credentials.key_id, credentials.team_id)
        self._pool = _EndpointPool(credentials, self._token, max_connections)
        self._timeout = timeout_seconds

    async def send(self, hint: Hint, target: Target) -> Outcome:
        request = self._request(hint, target.address)
        if request is None:
            return REJECTED
        status, reason = await self._attempt(request)
        if status == "403" and reason == EXPIRED_PROVIDER_TOKEN:
            self._token.renew()
            status, reason = await self._attempt(self._request(hint, target.address))  # type: ignore[arg-type]
        return TRANSIENT if status is None else outcome_for(status, reason)

    def _request(self, hint: Hint, token: str) -> NotificationRequest | None:
        body = apns_body(hint)
        collapse_id = body["topic"]
        too_big = len(json.dumps(body).encode()) > MAX_BODY_BYTES
        if too_big or len(collapse_id.encode()) > MAX_COLLAPSE_ID_BYTES:
            return None
        return NotificationRequest(
            device_token=token,
            message=body,
            priority=BACKGROUND_PRIORITY,
            push_type=PushType.BACKGROUND,
            collapse_key=collapse_id,
        )

    async def _attempt(self, request: NotificationRequest) -> tuple[str | None, str | None]:
        try:
            result = await asyncio.wait_for(self._pool.send_notification(request), self._timeout)
        except (TimeoutError, *CONNECTION_ERRORS):
            return None, None
        return str(result.status), result.description

    async def close(self) -> None:
        self._pool.close()
