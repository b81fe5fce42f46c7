"""APNs channel: background hints over HTTP/2 with token auth, through aioapns.

aioapns (pinned to 4.0) signs a new JWT for every connection; Apple refuses such
churn with TooManyProviderTokenUpdates, so one token is shared by the pool's
connections and renewed before it is an hour old (or when Apple says it
expired: once per expiry, however many answers said so). aioapns also has no
timeout of its own, and retries with sleeps; each send is bounded here and gets
a single attempt, retries go through our queue. The connection and pool
adjustments are in apns_connection.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from typing import Any

import jwt
from aioapns.common import NotificationRequest, PushType
from aioapns.connection import AuthorizationHeaderProvider
from aioapns.exceptions import ConnectionClosed, ConnectionError, MaxAttemptsExceeded

from app.delivery.credentials import ApnsCredentials
from app.delivery.providers.apns_connection import EndpointPool
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


# The body as aioapns serialises it (json.dumps defaults), without the topic and sequence id values.
BODY_OVERHEAD_BYTES = len(json.dumps({"aps": {"content-available": 1}, "topic": "", "sequence_id": ""}))


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

    def renew(self, rejected: str) -> None:
        """Apple refused `rejected` as expired (clock skew, long idle): sign a new one next time,
        unless another request already did, so a burst of such answers renews it once."""
        if self._header == rejected:
            self._header = None


class ApnsProvider:
    channel_label = "apns"

    def __init__(
        self, credentials: ApnsCredentials, timeout_seconds: float, max_connections: int = 4
    ) -> None:
        self._token = SharedToken(credentials.key_pem, credentials.key_id, credentials.team_id)
        self._pool = EndpointPool(credentials, self._token, max_connections)
        self._timeout = timeout_seconds

    async def send(self, hint: Hint, target: Target) -> Outcome:
        request = self._request(hint, target.address)
        if request is None:
            return REJECTED
        presented = self._token.get_header()  # what this attempt sends, unless renewed meanwhile
        status, reason = await self._attempt(request)
        if status == "403" and reason == EXPIRED_PROVIDER_TOKEN:
            self._token.renew(presented)
            status, reason = await self._attempt(self._request(hint, target.address))  # type: ignore[arg-type]
        return TRANSIENT if status is None else outcome_for(status, reason)

    def _request(self, hint: Hint, token: str) -> NotificationRequest | None:
        body = apns_body(hint)
        collapse_id = body["topic"]
        # Base64 and decimal digits are ASCII and need no escaping: the length is known without
        # serialising the body once more (aioapns serialises it for the request).
        too_big = BODY_OVERHEAD_BYTES + len(collapse_id) + len(body["sequence_id"]) > MAX_BODY_BYTES
        if too_big or len(collapse_id) > MAX_COLLAPSE_ID_BYTES:
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
            # asyncio.timeout, not wait_for: no extra task per send (the hot path of the channel).
            async with asyncio.timeout(self._timeout):
                result = await self._pool.send_notification(request)
        except (TimeoutError, *CONNECTION_ERRORS):
            return None, None
        return str(result.status), result.description

    async def close(self) -> None:
        self._pool.close()
