"""The `webpush` app type: its config keys, and a notification rendered for a browser's push
subscription as Sygnal renders it.

A device is a subscription: its pushkey is the endpoint URL and the pusher's data holds `p256dh`
and `auth`; the form Sygnal reads (the pushkey is `p256dh`, the data holds `endpoint` and `auth`) is
read too. The payload, encrypted to those keys by the channel, is the pusher's `default_payload`
with the notification's non-empty fields and counts as JSON; the content loses `formatted_body`, a
long `body` is cut and a long `ciphertext` left out, so the push stays within what push services
carry. With `only_last_per_room` (an app key, or the pusher's data as Sygnal reads it), a newer
push for a room replaces one still queued; with the pusher's `events_only`, a badge-only update
sends nothing. A subscription the push service calls gone (404, 410) or whose keys cannot be
encrypted to is rejected; anything else that fails, an endpoint refused by `allowed_endpoints` or
the URL rules included, answers 502.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from app.core.channels import Channel
from app.delivery.credentials import load_webpush
from app.delivery.providers.webpush import WebPushConfig
from app.delivery.types import OutcomeKind, Priority, Push, PushKind, WebPushKeys
from app.matrix.apps import AppType, AppValues, MatrixApp, RejectDevice
from app.matrix.notification import Device, Notification

EVENT_FIELDS = (
    "room_id",
    "room_name",
    "room_alias",
    "membership",
    "event_id",
    "sender",
    "sender_display_name",
    "user_is_target",
    "type",
)
MAX_BODY_CHARACTERS = 1000  # a message body longer than this is cut, ending in "…"
MAX_CIPHERTEXT_CHARACTERS = 2000  # an encrypted event's ciphertext longer than this is left out
REJECTING = frozenset({OutcomeKind.DEAD})
LOADED_KEYS = ("vapid_private_key", "vapid_contact_email", "ttl", "allowed_endpoints", "max_connections")


@dataclass(frozen=True, slots=True)
class WebPushOptions:
    only_last_per_room: bool


def make_app(values: AppValues) -> MatrixApp:
    names = {key: values.name(key) for key in LOADED_KEYS}
    given = {
        key: values.values[key]
        for key in ("ttl", "allowed_endpoints", "max_connections")
        if key in values.values
    }
    credentials = load_webpush(
        values.get("vapid_private_key", str, required=True),
        values.get("vapid_contact_email", str, required=True),
        names=names,
        **given,
    )
    options = WebPushOptions(values.get("only_last_per_room", bool, False))
    config = WebPushConfig(credentials, values.url_policy)
    return MatrixApp(
        values.app_id, "webpush", Channel.WEBPUSH, config, functools.partial(render_push, options), REJECTING
    )


APP_TYPE = AppType(keys=frozenset({*LOADED_KEYS, "only_last_per_room"}), make=make_app)


def render_push(options: WebPushOptions, notification: Notification, device: Device) -> Push | None:
    if device.data.get("events_only") is True and not notification.event_id:
        return None  # the pusher wants events only, and this is a badge update
    endpoint, keys = subscription(device)
    last_only = options.only_last_per_room or device.data.get("only_last_per_room") is True
    return Push(
        address=endpoint,
        payload=json.dumps(
            payload_for(notification, device), ensure_ascii=False, separators=(",", ":")
        ).encode(),
        kind=PushKind.ALERT,
        priority=Priority.NORMAL if notification.prio == "low" else Priority.HIGH,
        collapse_id=notification.room_id if last_only and notification.room_id else None,
        extras=keys,
    )


def subscription(device: Device) -> tuple[str, WebPushKeys]:
    """The endpoint and keys of a device: the pushkey is the endpoint with `p256dh` and `auth` in
    the data, or (Sygnal's form) the pushkey is `p256dh` with `endpoint` and `auth` in the data."""
    data = device.data
    endpoint: Any = device.pushkey
    p256dh: Any = data.get("p256dh")
    if "endpoint" in data:
        endpoint, p256dh = data.get("endpoint"), device.pushkey
    auth: Any = data.get("auth")
    if not all(isinstance(value, str) and value for value in (endpoint, p256dh, auth)):
        raise RejectDevice("the subscription's endpoint, p256dh or auth is missing")
    return endpoint, WebPushKeys(p256dh=p256dh, auth=auth)


def payload_for(n: Notification, device: Device) -> dict[str, Any]:
    payload: dict[str, Any] = dict(device.data.get("default_payload") or {})
    for name in EVENT_FIELDS:
        value = getattr(n, name)
        if value:
            payload[name] = value
    if n.unread is not None:
        payload["unread"] = n.unread
    if n.missed_calls is not None:
        payload["missed_calls"] = n.missed_calls
    if n.content:
        payload["content"] = _shortened(n.content)
    return payload


def _shortened(content: Any) -> dict[str, Any]:
    """The content as a browser can show it: no formatted body, a long body cut, a long
    ciphertext left out (a push service carries about 4 KB)."""
    shown = dict(content)
    shown.pop("formatted_body", None)
    body = shown.get("body")
    if isinstance(body, str) and len(body) > MAX_BODY_CHARACTERS:
        shown["body"] = body[: MAX_BODY_CHARACTERS - 1] + "…"
    ciphertext = shown.get("ciphertext")
    if isinstance(ciphertext, str) and len(ciphertext) > MAX_CIPHERTEXT_CHARACTERS:
        del shown["ciphertext"]
    return shown
