"""Web Push channel: a payload encrypted to a browser's subscription (RFC 8291, aes128gcm), posted to
its push service's endpoint with a VAPID authorization (RFC 8292).

The encryption is pywebpush's (`WebPusher.encode`, through http_ece) and the VAPID token py_vapid's;
the post is ours, with aiohttp, rather than pywebpush's own sending: its blocking path uses
`requests`, and its asynchronous one reads the whole answer into memory and resolves names itself.
An endpoint is a URL anyone may register, so it goes through the webhook URL policy before every
attempt, is pinned to the checked addresses, bounded in time, and its answer read up to 4 KiB.
An app's `allowed_endpoints` globs narrow the hosts further.

One VAPID token per push service origin is signed and kept until it nears its expiry, so a push
costs one encryption and no signature.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import aiohttp
from py_vapid import VapidException
from pywebpush import WebPusher, WebPushException

from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.delivery.causes import DNS, connection_cause, credentials_refused, http_cause
from app.delivery.credentials import WebPushCredentials
from app.delivery.deadlines import Deadlines
from app.delivery.egress import DIRECT, EgressProxy
from app.delivery.health import ProviderHealth
from app.delivery.pinned_http import TRANSIENT_ERRORS, PinnedSession, read_answer
from app.delivery.types import (
    DEAD,
    DELIVERED,
    FAILED,
    REJECTED,
    Outcome,
    OutcomeKind,
    Priority,
    Push,
    WebPushKeys,
)
from app.delivery.url_policy import (
    SharedLookups,
    UrlNotAllowed,
    UrlNotResolved,
    UrlPolicy,
    check_webhook_url,
)

# Status -> outcome; ranges after exact codes. 404 and 410: the subscription expired or was
# withdrawn (RFC 8030 section 7.3), for good. 400, 401, 403, 413: our request or our VAPID key
# was refused, not the subscription's fault.
STATUS_OUTCOMES: dict[int, Outcome] = {404: DEAD, 410: DEAD}
RANGE_OUTCOMES: tuple[tuple[range, Outcome], ...] = (
    (range(200, 300), DELIVERED),
    (range(500, 600), FAILED),
)
RETRY_AFTER_STATUSES = frozenset({429, 503})  # FAILED, after the service's Retry-After
# A push service refusing the VAPID authorization (RFC 8292 section 4.1: 401 a token that does not
# verify, 403 a key other than the subscription's); told as refused credentials when the service is
# one the app lists (allowed_endpoints): anyone's endpoint could answer so.
VAPID_REFUSED_STATUSES = frozenset({401, 403})
# Our VAPID key would not sign a token.
KEY_REFUSED = replace(
    REJECTED, credentials_refused=True, reason=credentials_refused("the VAPID key signs no token")
)
# Endpoints not sent to: not among the app's allowed_endpoints, refused by the URL policy (not https,
# a private address), or a host name that does not resolve.
NOT_LISTED = replace(REJECTED, reason="the endpoint's host is not in allowed_endpoints")
NOT_ALLOWED = replace(REJECTED, reason="the endpoint is not allowed (not https, or a private address)")
NOT_RESOLVED = replace(FAILED, reason=DNS)
MAX_RETRY_AFTER_SECONDS = 3600.0
# Keys that cannot be encrypted to (not a P-256 point, an auth secret that is not 16 bytes): the
# subscription can never receive a push.
BAD_KEYS = DEAD
AUTH_SECRET_BYTES = 16
# Web Push has urgencies very-low, low, normal and high (RFC 8030 section 5.3): a normal push waits
# for a convenient moment, as APNs priority 5 does, and a high one goes as soon as it can.
URGENCIES = {Priority.NORMAL: "low", Priority.HIGH: "normal"}
# The header that lets a queued push be replaced (RFC 8030 section 5.4) is at most 32 base64url
# characters: a collapse id is hashed into one.
COLLAPSE_HEADER = "topic"
COLLAPSE_DIGEST_BYTES = 22
VAPID_TOKEN_SECONDS = 12 * 3600  # push services refuse tokens that live longer than 24 hours
VAPID_RENEW_SECONDS = 3600  # a token is signed again when less than this is left
MAX_VAPID_ORIGINS = 1024


@dataclass(frozen=True, slots=True)
class WebPushConfig:
    """One Web Push app: its credentials, and which URLs may be called (the webhooks' policy)."""

    credentials: WebPushCredentials
    policy: UrlPolicy


def outcome_for_status(status: int, retry_after: str | None = None) -> Outcome:
    if status in RETRY_AFTER_STATUSES:
        return Outcome(OutcomeKind.FAILED, delay_seconds=_retry_after_seconds(retry_after))
    if status in STATUS_OUTCOMES:
        return STATUS_OUTCOMES[status]
    for codes, outcome in RANGE_OUTCOMES:
        if status in codes:
            return outcome
    return REJECTED  # 3xx included: redirects are refused


def _retry_after_seconds(raw: str | None) -> float | None:
    """Retry-After in seconds (an HTTP date is not followed: the retry rule's own delay applies)."""
    try:
        return min(MAX_RETRY_AFTER_SECONDS, max(0.0, float(raw))) if raw else None
    except ValueError:
        return None


def collapse_header(collapse_id: str) -> str:
    """The replacement header's value for a collapse id: pushes with the same one replace each other
    while queued."""
    digest = hashlib.blake2s(collapse_id.encode(), digest_size=COLLAPSE_DIGEST_BYTES).digest()
    return base64.urlsafe_b64encode(digest).decode()


@functools.lru_cache(maxsize=64)
def _glob_pattern(globs: tuple[str, ...]) -> re.Pattern[str]:
    """`*` and `?` over a whole host[:port], case-insensitively; every other character is literal."""
    parts = ("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in g) for g in globs)
    return re.compile("|".join(f"(?:{part})" for part in parts), re.IGNORECASE)


def endpoint_allowed(url: str, globs: tuple[str, ...]) -> bool:
    """Whether an endpoint's host, with its port when the URL gives one, matches an allowed glob;
    every endpoint is when there are none."""
    if not globs:
        return True
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").rstrip("."), parts.port
    except ValueError:
        return False
    netloc = f"[{host}]" if ":" in host else host
    return _glob_pattern(globs).fullmatch(netloc if port is None else f"{netloc}:{port}") is not None


@functools.lru_cache(maxsize=8192)
def origin_of(url: str) -> str:
    """The VAPID audience: the endpoint's scheme, host and port as the URL gives them."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def encrypt(payload: bytes, keys: WebPushKeys) -> bytes | None:
    """The aes128gcm body for the subscription's keys; None when they cannot be encrypted to."""
    try:
        if len(base64.urlsafe_b64decode(keys.auth + "=" * (-len(keys.auth) % 4))) != AUTH_SECRET_BYTES:
            return None
        subscription = {"endpoint": "", "keys": {"p256dh": keys.p256dh, "auth": keys.auth}}
        body: bytes = WebPusher(subscription).encode(payload, "aes128gcm")["body"]
    except (ValueError, TypeError, binascii.Error, WebPushException):
        return None
    return body


class VapidTokens:
    """The Authorization header per push service origin, signed once and renewed near its expiry."""

    def __init__(self, credentials: WebPushCredentials, clock: Callable[[], float] = time.time) -> None:
        self._credentials = credentials
        self._clock = clock
        self._headers: dict[str, tuple[str, float]] = {}  # origin -> (header, renew at)

    def header(self, origin: str) -> str:
        now = self._clock()
        cached = self._headers.get(origin)
        if cached is not None and now < cached[1]:
            return cached[0]
        if len(self._headers) >= MAX_VAPID_ORIGINS:
            self._headers.clear()
        expires = int(now) + VAPID_TOKEN_SECONDS
        claims = {"sub": self._credentials.contact, "aud": origin, "exp": expires}
        header = str(self._credentials.vapid.sign(claims)["Authorization"])
        self._headers[origin] = (header, expires - VAPID_RENEW_SECONDS)
        return header


class WebPushProvider:
    channel = Channel.WEBPUSH

    def __init__(
        self,
        config: WebPushConfig,
        timeout_seconds: float,
        *,
        app: AppName = DEFAULT_APP,
        proxy: EgressProxy = DIRECT,
    ) -> None:
        self.app = app
        self._credentials = config.credentials
        self._policy = config.policy
        self._ttl = str(config.credentials.ttl_seconds)
        self._tokens = VapidTokens(config.credentials)
        self._lookups = SharedLookups()
        self._deadlines = Deadlines(timeout_seconds)
        # The VAPID key is loaded (load_webpush signed with it once): not known bad.
        self._health = ProviderHealth(self.channel, app)
        self._judges_key = bool(config.credentials.allowed_endpoints)
        self._session = PinnedSession(config.credentials.max_connections, self._health.connected, proxy)

    async def send(self, push: Push) -> Outcome:
        keys, payload = push.extras, push.payload
        if not isinstance(keys, WebPushKeys) or not isinstance(payload, bytes) or not payload:
            return REJECTED
        if not endpoint_allowed(push.address, self._credentials.allowed_endpoints):
            return NOT_LISTED
        try:
            checked = await check_webhook_url(push.address, self._policy, self._lookups)
        except UrlNotResolved:
            return NOT_RESOLVED
        except UrlNotAllowed:
            return NOT_ALLOWED
        body = encrypt(payload, keys)
        if body is None:
            return BAD_KEYS
        try:
            headers = self._headers(push, origin_of(push.address))
        except VapidException:
            self._health.refused()
            return KEY_REFUSED
        try:
            with self._deadlines.bound():
                async with self._session.post(checked, body, headers) as response:
                    await read_answer(response)
                    outcome = outcome_for_status(response.status, response.headers.get("retry-after"))
        except TRANSIENT_ERRORS as error:
            return replace(FAILED, reason=connection_cause(error))
        except aiohttp.ClientError as error:
            return replace(REJECTED, reason=f"the request failed ({type(error).__name__})")
        if outcome.kind is not OutcomeKind.DELIVERED:
            outcome = replace(outcome, reason=http_cause(response.status))
        return self._judged(response.status, outcome) if self._judges_key else outcome

    def _judged(self, status: int, outcome: Outcome) -> Outcome:
        """An answer of a listed push service: whether it took the VAPID authorization."""
        if status in VAPID_REFUSED_STATUSES:
            self._health.refused()
            return replace(outcome, credentials_refused=True, reason=credentials_refused(http_cause(status)))
        if outcome.kind is OutcomeKind.DELIVERED:
            self._health.accepted()
        return outcome

    def _headers(self, push: Push, origin: str) -> dict[str, str]:
        ttl = self._ttl if push.expires_at is None else str(max(0, push.expires_at - int(time.time())))
        headers = {
            "content-encoding": "aes128gcm",
            "content-type": "application/octet-stream",
            "ttl": ttl,
            "urgency": URGENCIES[push.priority],
            "authorization": self._tokens.header(origin),
        }
        if push.collapse_id is not None:
            headers[COLLAPSE_HEADER] = collapse_header(push.collapse_id)
        return headers

    def sample_gauges(self) -> None:
        self._health.connections(*self._session.counts())

    async def close(self) -> None:
        await self._session.close()
        await self._deadlines.close()
