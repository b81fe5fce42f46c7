"""FCM channel: data messages through firebase-admin's async API.

firebase-admin (pinned to 7.7) is used for what it does well: the message
model, OAuth2 from the service account (its own token_uri, so a local token
endpoint works in tests), the async HTTP/2 client and the mapping of FCM error
bodies to exceptions. These things are adjusted, all in this module: the base
URL (XMTP_PUSH_FCM_ENDPOINT), the library's own retries (off: retries go
through our queue), the Android priority, written as the API's enum name, the
OAuth scope (FCM's own, not the library's cloud-platform set), and the OAuth
token fetch: the library's httpx auth flow has google-auth fetch a token with
a blocking call (120 s timeout, retries with sleeps) before a request whose
token has expired and again after every 401, on the event loop, which would
stall it, and with it every channel of the worker. Its flow is replaced by
HeldToken, which only puts on the token we hold; the fetch is done here in a
thread, bounded by our timeout, before the request needs it and after a 401.
Both go through the egress proxy (app.delivery.egress) when one carries their
host: the library has no option for it, so its HTTPS transport is given one.
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
import httpx
from firebase_admin import credentials as firebase_credentials
from firebase_admin import exceptions, messaging
from firebase_admin._http_client import HttpxAsyncClient
from firebase_admin._retry import HttpxRetry
from google.auth import exceptions as google_auth_exceptions
from google.auth.transport import requests as google_auth_requests

from app.core import metrics
from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.core.proxies import Proxy
from app.delivery.causes import connection_cause, credentials_refused, http_cause
from app.delivery.credentials import FcmCredentials
from app.delivery.egress import DIRECT, EgressProxy, note_failure, tunnel_opened
from app.delivery.health import ProviderHealth
from app.delivery.types import (
    DELIVERED,
    FAILED,
    MISMATCH,
    REJECTED,
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
# The FcmError codes firebase-admin answers with an error class of their own (the others, by status).
FCM_CODES: tuple[tuple[type[Exception], str], ...] = (
    (messaging.UnregisteredError, "UNREGISTERED"),
    (messaging.SenderIdMismatchError, "SENDER_ID_MISMATCH"),
    (messaging.QuotaExceededError, "QUOTA_EXCEEDED"),
    (messaging.ThirdPartyAuthError, "THIRD_PARTY_AUTH_ERROR"),
)
CODE_OUTCOMES: dict[str, Outcome] = {
    exceptions.UNAVAILABLE: FAILED,
    exceptions.INTERNAL: FAILED,
    exceptions.DEADLINE_EXCEEDED: FAILED,
    exceptions.UNKNOWN: FAILED,  # transport errors with no response
}
TRANSIENT_STATUSES = {500, 503}
# A failed push (500, 503, UNAVAILABLE, INTERNAL, a timeout) is tried again no sooner than this, or its
# Retry-After when that says more (the XMTP backend's FCM table): FCM asks to be left alone a while.
RETRY_FLOOR_SECONDS = 10.0
# A 403 refuses the push whatever its body names (a front end's answer, a code of another status):
# never retried, as Sygnal.
REFUSED_STATUS = 403
TOKEN_REFUSED = replace(
    FAILED, credentials_refused=True, reason=credentials_refused("by the OAuth token endpoint")
)
# Answers that refuse the project's credentials rather than the message: the access token or the
# service account (401, 403), or the APNs credentials the project holds for iOS devices.
CREDENTIAL_ERRORS: tuple[type[Exception], ...] = (
    exceptions.UnauthenticatedError,
    exceptions.PermissionDeniedError,
    messaging.ThirdPartyAuthError,
)
# A 401 answering the access token we hold, within its life (revoked, or the clock is off): the token
# is dropped, another fetched off the event loop, and the push sent once more; a 401 to that one
# refuses the credentials like the errors above, and a fetch that fails answers as a fetch failing.
TOKEN_STALE_STATUS = 401


ANDROID_PRIORITIES = {Priority.NORMAL: "normal", Priority.HIGH: "high"}


class _Message(messaging.Message):  # type: ignore[misc]
    """A v1 message with the fields of a push's `fcm_options` to merge under ours, and its
    `message_fields` to lay over them."""

    def __init__(
        self, base_fields: Mapping[str, Any] | None, over_fields: Mapping[str, Any] | None, **fields: Any
    ) -> None:
        super().__init__(**fields)
        self.base_fields = base_fields  # not `fcm_options`: the library's message has one of its own
        self.over_fields = over_fields


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
            extras.message_fields,
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
        return Outcome(
            OutcomeKind.FAILED,
            delay_seconds=_quota_delay(error),
            pause_channel=True,
            retry_after=_retry_after(error),
        )
    for kind, outcome in EXCEPTION_OUTCOMES:
        if isinstance(error, kind):
            return outcome
    if _status(error) == REFUSED_STATUS:
        return REJECTED
    if _status(error) in TRANSIENT_STATUSES:
        delay = _retry_after(error)  # FCM may say when to come back from a 500/503
        return (
            FAILED
            if delay is None
            else Outcome(OutcomeKind.FAILED, delay_seconds=min(delay, QUOTA_DELAY_MAX))
        )
    code = getattr(error, "code", None)
    return CODE_OUTCOMES.get(code, REJECTED) if isinstance(code, str) else REJECTED


def error_cause(error: BaseException) -> str:
    """What FCM answered (its status and error code: `HTTP 429 QUOTA_EXCEEDED`), or what the
    request met when no answer came."""
    status = _status(error)
    return connection_cause(error) if status is None else http_cause(status, _fcm_code(error))


def _fcm_code(error: BaseException) -> str | None:
    """FCM's error code as firebase-admin tells it: by the error's class, else its status."""
    for kind, code in FCM_CODES:
        if isinstance(error, kind):
            return code
    status = getattr(error, "code", None)
    return status if isinstance(status, str) else None


def _told(outcome: Outcome, cause: str) -> Outcome:
    return replace(outcome, reason=cause)


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


class HeldToken(httpx.Auth):
    """Puts the access token we hold on a request and does nothing else: in the place of
    firebase-admin's flow, which has google-auth fetch a token on the event loop."""

    def __init__(self, credential: Any) -> None:
        self._credential = credential

    def auth_flow(self, request: httpx.Request) -> Any:
        self._credential.apply(request.headers)
        yield request


def _sent_authorization(error: BaseException | None) -> str | None:
    response = getattr(error, "http_response", None)
    request = getattr(response, "request", None)
    return request.headers.get("authorization") if isinstance(request, httpx.Request) else None


class _EndpointMessagingService(messaging._MessagingService):  # type: ignore[misc]
    def __init__(
        self, app: firebase_admin.App, endpoint: str, timeout_seconds: float, proxy: Proxy | None = None
    ) -> None:
        super().__init__(app)
        self._credential: Any = self._credential.with_scopes([FCM_SCOPE])
        self._fcm_url = f"{endpoint}/v1/projects/{self._project_id}/messages:send"
        self._async_client = HttpxAsyncClient(
            credential=self._credential, timeout=timeout_seconds, retry_config=HttpxRetry(max_retries=0)
        )
        self._async_client.async_client.auth = HeldToken(self._credential)
        if proxy is not None:
            # firebase-admin 7.7 (pinned) wraps httpx's transport in its retrying one, mounted for
            # https://; the wrapped transport is swapped for one through the proxy.
            via = httpx.Proxy(proxy.url, headers=proxy.headers)
            tunnelled = httpx.AsyncHTTPTransport(retries=0, http2=True, proxy=via)
            self._async_client._mounts["https://"]._wrapped_transport = tunnelled

    def _message_data(self, message: messaging.Message, dry_run: bool) -> dict[str, Any]:
        data: dict[str, Any] = super()._message_data(message, dry_run)
        android = data["message"].get("android")
        if android and "priority" in android:
            android["priority"] = android["priority"].upper()
        base_fields = getattr(message, "base_fields", None)
        if base_fields:
            data["message"] = merged(base_fields, data["message"])
        over_fields = getattr(message, "over_fields", None)
        if over_fields:
            data["message"] = merged(data["message"], over_fields)
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


def _token_proxies(tunnel: Proxy | None) -> dict[str, str | None]:
    """`requests` proxies for the token endpoint: ours, or none (None keeps the environment's out)."""
    return {"https": tunnel.url_with_credentials if tunnel else None, "http": None}


class FcmProvider:
    channel = Channel.FCM

    def __init__(
        self,
        credentials: FcmCredentials,
        timeout_seconds: float,
        *,
        app: AppName = DEFAULT_APP,
        proxy: EgressProxy = DIRECT,
    ) -> None:
        self.app = app
        account = credentials.service_account
        # One firebase app per service account, all of it, and project: another key or token_uri is
        # another app, and so is another project pushed to with the same account (two Matrix apps may
        # share an account file); a firebase app holds one projectId, which names the send URL.
        named = json.dumps([account, credentials.project_id], sort_keys=True)
        name = "xmtp-push-" + hashlib.sha256(named.encode()).hexdigest()[:16]
        try:
            self._app = firebase_admin.get_app(name)
        except ValueError:
            certificate = firebase_credentials.Certificate(account)
            self._app = firebase_admin.initialize_app(
                certificate, {"projectId": credentials.project_id, "httpTimeout": timeout_seconds}, name=name
            )
        tunnel = self._tunnel = proxy.for_url(credentials.endpoint)
        self._token_tunnel = proxy.for_url(str(account.get("token_uri", "")))
        self._service = _EndpointMessagingService(self._app, credentials.endpoint, timeout_seconds, tunnel)
        self._timeout = timeout_seconds
        # google-auth's HTTP transport, with our timeout in place of its 120 s default, and our
        # choice of proxy in place of the environment's.
        self._auth_request = functools.partial(
            google_auth_requests.Request(),
            timeout=timeout_seconds,
            proxies=_token_proxies(self._token_tunnel),
        )
        self._fetch: asyncio.Future[None] | None = None
        self._health = ProviderHealth(self.channel, app, connects=False)  # httpx does not tell them
        self._refreshes = {
            result: metrics.fcm_token_refreshes_total.labels(app.label, result) for result in ("ok", "failed")
        }

    async def _ensure_access_token(self) -> None:
        """Fetch the OAuth token off the event loop: one fetch for all sends needing it, each send
        waiting for it at most our timeout."""
        if self._service._credential.valid:
            return
        if self._fetch is None or self._fetch.done():
            self._fetch = asyncio.ensure_future(self._fetched())
            self._fetch.add_done_callback(lambda fetch: fetch.cancelled() or fetch.exception())
        await asyncio.wait_for(asyncio.shield(self._fetch), self._timeout)

    async def _fetched(self) -> None:
        try:
            await asyncio.to_thread(self._service._credential.refresh, self._auth_request)
        except google_auth_exceptions.RefreshError:  # the token endpoint refused the account
            self._refreshes["failed"].inc()
            self._health.refused()
            raise
        except Exception as error:  # unreachable, slow: no verdict on the credentials
            self._refreshes["failed"].inc()
            if self._token_tunnel is not None:
                note_failure(self._token_tunnel, error)
            raise
        self._refreshes["ok"].inc()

    async def send(self, push: Push) -> Outcome:
        message = fcm_message(push)
        if message is None:
            return REJECTED
        outcome = await self._attempt(message, retry_stale=True)
        if outcome is None:  # a 401 to the token we held: once more, with a fresh one
            outcome = await self._attempt(message, retry_stale=False)
        return FAILED if outcome is None else outcome

    async def _attempt(self, message: messaging.Message, *, retry_stale: bool) -> Outcome | None:
        """The outcome of one request, or None when FCM refused our token within its life and
        `retry_stale` asks for another try."""
        try:
            await self._ensure_access_token()
        except google_auth_exceptions.RefreshError:  # the account refused: try again later, and tell
            return TOKEN_REFUSED
        except Exception as error:  # token endpoint down or slow: try again later
            return _told(FAILED, f"OAuth token endpoint: {connection_cause(error)}")
        try:
            batch = await self._service.send_each_async([message], dry_run=False)
        except exceptions.FirebaseError as error:
            return self._judged(error)
        except Exception as error:  # transport trouble: try again later
            return _told(FAILED, connection_cause(error))
        response = batch.responses[0]
        answer = None if response.success else response.exception
        stale = self._dropped_stale_token(answer)
        return None if stale and retry_stale else self._judged(answer)

    def _dropped_stale_token(self, error: BaseException | None) -> bool:
        """Whether FCM answered 401 to the token we hold; if so it is dropped, so that the next
        request fetches another (not when another send already has: that one is not refused)."""
        if _status(error) != TOKEN_STALE_STATUS:
            return False
        credential = self._service._credential
        if credential.token is not None and _sent_authorization(error) == f"Bearer {credential.token}":
            credential.token = None
        return True

    def _judged(self, error: BaseException | None) -> Outcome:
        """The outcome of an answer, noting whether it took the credentials (and whether the
        egress proxy carried it)."""
        if self._tunnel is not None and error is not None:
            note_failure(self._tunnel, error)
        elif self._tunnel is not None:
            tunnel_opened(self._tunnel)
        if isinstance(error, CREDENTIAL_ERRORS):
            self._health.refused()
            refused = replace(outcome_for_error(error), credentials_refused=True)
            return _told(refused, credentials_refused(error_cause(error)))
        if error is None or _status(error) is not None:
            self._health.accepted()
        return DELIVERED if error is None else _told(outcome_for_error(error), error_cause(error))

    def sample_gauges(self) -> None:
        self._health.connections(*self._service.connection_counts())  # credentials: as answers come

    async def close(self) -> None:
        if self._fetch is not None:
            self._fetch.cancel()  # its thread ends on its own; a closed provider counts nothing more
        await self._service._async_client.aclose()
