"""FCM channel: data messages through firebase-admin's async API.

firebase-admin (pinned to 7.7) is used for what it does well: the message
model, OAuth2 from the service account (its own token_uri, so a local token
endpoint works in tests), the async HTTP/2 client and the mapping of FCM error
bodies to exceptions. These things are adjusted, all in this module: the base
URL (XMTP_PUSH_FCM_ENDPOINT), the library's own retries (off: retries go
through our queue), the Android priority, written as the API's enum name, the
OAuth scope (FCM's own, not the library's cloud-platform set), and the OAuth
token fetch: google-auth makes it with a blocking call (120 s timeout, retries
with sleeps) from inside the request, which would stall the event loop, and
with it every channel of the worker; it is done here in a thread, bounded by
our timeout, before the request needs it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import firebase_admin
from firebase_admin import credentials as firebase_credentials
from firebase_admin import exceptions, messaging
from firebase_admin._http_client import HttpxAsyncClient
from firebase_admin._retry import HttpxRetry
from google.auth import exceptions as google_auth_exceptions
from google.auth.transport import requests as google_auth_requests

from app.core import metrics
from app.delivery.credentials import FcmCredentials
from app.delivery.health import ProviderHealth
from app.delivery.provider import DEFAULT_APP
from app.delivery.types import (
    DELIVERED,
    MISMATCH,
    REJECTED,
    TRANSIENT,
    FcmExtras,
    Outcome,
    OutcomeKind,
    Priority,
    Push,
    PushKind,
)

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
QUOTA_DELAY_DEFAULT, QUOTA_DELAY_MIN, QUOTA_DELAY_MAX = 60.0, 60.0, 300.0
# firebase-admin exception or error code -> outcome (quota is handled apart: it pauses the channel).
EXCEPTION_OUTCOMES: tuple[tuple[type[Exception], Outcome], ...] = (
    (messaging.UnregisteredError, Outcome(OutcomeKind.DEAD)),
    (messaging.SenderIdMismatchError, MISMATCH),
)
CODE_OUTCOMES: dict[str, Outcome] = {
    exceptions.UNAVAILABLE: TRANSIENT,
    exceptions.INTERNAL: TRANSIENT,
    exceptions.DEADLINE_EXCEEDED: TRANSIENT,
    exceptions.UNKNOWN: TRANSIENT,  # transport errors with no response
}
TRANSIENT_STATUSES = {500, 503}
TOKEN_REFUSED = replace(TRANSIENT, credentials_refused=True)
# Answers that refuse the project's credentials rather than the message: the access token or the
# service account (401, 403), or the APNs credentials the project holds for iOS devices.
CREDENTIAL_ERRORS: tuple[type[Exception], ...] = (
    exceptions.UnauthenticatedError,
    exceptions.PermissionDeniedError,
    messaging.ThirdPartyAuthError,
)


ANDROID_PRIORITIES = {Priority.NORMAL: "normal", Priority.HIGH: "high"}


class _Message(messaging.Message):  # type: ignore[misc]
    """A v1 message with the fields of a push's `fcm_options` to merge under ours."""

    def __init__(self, base_fields: Mapping[str, Any] | None, **fields: Any) -> None:
        super().__init__(**fields)
        self.base_fields = base_fields  # not `fcm_options`: the library's message has one of its own


def fcm_message(push: Push) -> messaging.Message | None:
    """The v1 message for a push, or None when it carries no data map. For iOS apps on FCM a
    background push is sent as APNs requires one (priority 5, content-available)."""
    if isinstance(push.payload, bytes):
        return None
    extras = push.extras if isinstance(push.extras, FcmExtras) else FcmExtras()
    background = push.kind is PushKind.BACKGROUND
    urgent = push.priority is Priority.HIGH and not background
    apns = None
    if extras.apns_block:
        apns = messaging.APNSConfig(
            headers={"apns-priority": "10" if urgent else "5", "apns-push-type": push.kind.value},
            payload=messaging.APNSPayload(aps=messaging.Aps(content_available=background or None)),
        )
    with warnings.catch_warnings():
        # The v1 API's field is still `token`; the library prefers a newer name.
        warnings.filterwarnings("ignore", message="Message.token is deprecated", category=DeprecationWarning)
        return _Message(
            extras.fcm_options,
            token=push.address,
            data=dict(push.payload),
            android=messaging.AndroidConfig(
                priority=ANDROID_PRIORITIES[push.priority],
                collapse_key=push.collapse_id,
                ttl=_ttl(push.expires_at),
            ),
            apns=apns,
        )


def merged(base: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `ours` laid over it, object by object; where both set a value, ours wins."""
    result = dict(base)
    for key, value in ours.items():
        below = result.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            result[key] = merged(below, value)
        else:
            result[key] = value
    return result


def _ttl(expires_at: int | None) -> int | None:
    return None if expires_at is None else max(0, expires_at - int(time.time()))


def outcome_for_error(error: BaseException | None) -> Outcome:
    if isinstance(error, messaging.QuotaExceededError) or _status(error) == 429:
        return Outcome(OutcomeKind.TRANSIENT, delay_seconds=_quota_delay(error), pause_channel=True)
    for kind, outcome in EXCEPTION_OUTCOMES:
        if isinstance(error, kind):
            return outcome
    if _status(error) in TRANSIENT_STATUSES:
        delay = _retry_after(error)  # FCM may say when to come back from a 500/503
        return (
            TRANSIENT
            if delay is None
            else Outcome(OutcomeKind.TRANSIENT, delay_seconds=min(delay, QUOTA_DELAY_MAX))
        )
    code = getattr(error, "code", None)
    return CODE_OUTCOMES.get(code, REJECTED) if isinstance(code, str) else REJECTED


def _status(error: BaseException | None) -> int | None:
    response = getattr(error, "http_response", None)
    return getattr(response, "status_code", None)


def _quota_delay(error: BaseException | None) -> float:
    delay = _retry_after(error)
    return min(QUOTA_DELAY_MAX, max(QUOTA_DELAY_MIN, QUOTA_DELAY_DEFAULT if delay is None else delay))


def _retry_after(error: BaseException | None) -> float | None:
    """The answer's Retry-After in seconds, when it gives one as a number."""
    response = getattr(error, "http_response", None)
    raw = response.headers.get("retry-after") if response is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


class _EndpointMessagingService(messaging._MessagingService):  # type: ignore[misc]
    def __init__(self, app: firebase_admin.App, endpoint: str, timeout_seconds: float) -> None:
        super().__init__(app)
        self._credential: Any = self._credential.with_scopes([FCM_SCOPE])
        self._fcm_url = f"{endpoint}/v1/projects/{self._project_id}/messages:send"
        self._async_client = HttpxAsyncClient(
            credential=self._credential, timeout=timeout_seconds, retry_config=HttpxRetry(max_retries=0)
        )

    def _message_data(self, message: messaging.Message, dry_run: bool) -> dict[str, Any]:
        data: dict[str, Any] = super()._message_data(message, dry_run)
        android = data["message"].get("android")
        if android and "priority" in android:
            android["priority"] = android["priority"].upper()
        base_fields = getattr(message, "base_fields", None)
        if base_fields:
            data["message"] = merged(base_fields, data["message"])
        return data

    def connection_counts(self) -> tuple[int, int]:
        """(open, in use): the connections of httpx's pools under the client, read through
        firebase-admin's transports (`_mounts`, `_wrapped_transport`) and httpx's (`_pool`), then
        httpcore's public `connections`; firebase-admin 7.7 and httpx 0.28, pinned."""
        connections = [
            connection
            for transport in self._async_client._mounts.values()
            for connection in transport._wrapped_transport._pool.connections
            if not connection.is_closed()
        ]
        return len(connections), sum(1 for connection in connections if not connection.is_idle())


class FcmProvider:
    channel = "fcm"

    def __init__(
        self, credentials: FcmCredentials, timeout_seconds: float, *, app: str = DEFAULT_APP
    ) -> None:
        self.app = app
        account = credentials.service_account
        # One firebase app per service account, all of it: another key or token_uri is another app.
        name = "xmtp-push-" + hashlib.sha256(json.dumps(account, sort_keys=True).encode()).hexdigest()[:16]
        try:
            self._app = firebase_admin.get_app(name)
        except ValueError:
            certificate = firebase_credentials.Certificate(account)
            self._app = firebase_admin.initialize_app(
                certificate, {"projectId": credentials.project_id, "httpTimeout": timeout_seconds}, name=name
            )
        self._service = _EndpointMessagingService(self._app, credentials.endpoint, timeout_seconds)
        self._timeout = timeout_seconds
        # google-auth's HTTP transport, with our timeout in place of its 120 s default.
        self._auth_request = functools.partial(google_auth_requests.Request(), timeout=timeout_seconds)
        self._refreshing = asyncio.Lock()
        self._health = ProviderHealth(self.channel, app, connects=False)  # httpx does not tell them
        self._refreshes = {
            result: metrics.fcm_token_refreshes_total.labels(app, result) for result in ("ok", "failed")
        }

    async def _ensure_access_token(self) -> None:
        """Fetch the OAuth token off the event loop, once for all sends waiting on it."""
        credential = self._service._credential
        if credential.valid:
            return
        async with self._refreshing:
            if not credential.valid:
                refresh = asyncio.to_thread(credential.refresh, self._auth_request)
                try:
                    await asyncio.wait_for(refresh, self._timeout)
                except google_auth_exceptions.RefreshError:  # the token endpoint refused the account
                    self._refreshes["failed"].inc()
                    self._health.refused()
                    raise
                except Exception:  # unreachable, slow: no verdict on the credentials
                    self._refreshes["failed"].inc()
                    raise
                self._refreshes["ok"].inc()

    async def send(self, push: Push) -> Outcome:
        message = fcm_message(push)
        if message is None:
            return REJECTED
        try:
            await self._ensure_access_token()
        except google_auth_exceptions.RefreshError:  # the account refused: try again later, and tell
            return TOKEN_REFUSED
        except Exception:  # token endpoint down or slow: try again later
            return TRANSIENT
        try:
            batch = await self._service.send_each_async([message], dry_run=False)
        except exceptions.FirebaseError as error:
            return self._judged(error)
        except Exception:  # OAuth token endpoint or transport trouble: try again later
            return TRANSIENT
        response = batch.responses[0]
        return self._judged(None if response.success else response.exception)

    def _judged(self, error: BaseException | None) -> Outcome:
        """The outcome of an answer, noting whether it took the credentials."""
        if isinstance(error, CREDENTIAL_ERRORS):
            self._health.refused()
            return replace(outcome_for_error(error), credentials_refused=True)
        if error is None or _status(error) is not None:
            self._health.accepted()
        return DELIVERED if error is None else outcome_for_error(error)

    def sample_gauges(self) -> None:
        self._health.connections(*self._service.connection_counts())  # credentials: as answers come

    async def close(self) -> None:
        await self._service._async_client.aclose()
