"""The `gcm` app type (FCM HTTP v1): its config keys, and a notification as Sygnal's v1 data message.

The data map is the pusher's `default_payload`, then the event's fields (each cut to 1024 bytes,
ending in "…" when cut), the content's string fields as `content_<key>`, `prio` (high or normal)
and the counts; all of it strings, as FCM requires: a null or absent field is left out (never the
text "None"), and a non-string value from `default_payload` is sent as its JSON text. The
operator's `fcm_options` are merged into the message; Android priority follows `prio`. An app with
`send_badge_counts: false` leaves the counts out, and sends no badge-only update at all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from app.core.channels import Channel
from app.delivery.credentials import FCM_ENDPOINT, FcmCredentials, load_fcm
from app.delivery.types import FcmExtras, OutcomeKind, Priority, Push, PushKind
from app.matrix.apps import AppType, AppValues, MatrixApp
from app.matrix.notification import Device, Notification

MAX_BYTES_PER_FIELD = 1024
EVENT_FIELDS = (
    "event_id",
    "type",
    "sender",
    "room_name",
    "room_alias",
    "membership",
    "sender_display_name",
    "room_id",
)
# Only an unregistered token is the token's fault for good (FCM's 404).
REJECTING = frozenset({OutcomeKind.DEAD})
DEFAULT_MAX_CONNECTIONS = 20


def make_app(values: AppValues) -> MatrixApp:
    api_version = values.get("api_version", str)
    if api_version != "v1":
        raise values.error(
            "api_version",
            "must be v1: Google shut the legacy FCM API down (set api_version: v1, project_id "
            "and service_account_file)",
        )
    fcm_options: dict[str, Any] = values.get("fcm_options", dict, {})
    values.positive("max_connections", DEFAULT_MAX_CONNECTIONS)  # checked; HTTP/2 multiplexes
    extras = FcmExtras(fcm_options=fcm_options or None, apns_block=False)
    render = functools.partial(render_push, extras, values.get("send_badge_counts", bool, True))
    return MatrixApp(values.app_id, "gcm", Channel.FCM, _credentials(values), render, REJECTING)


def _credentials(values: AppValues) -> FcmCredentials:
    project_id: str = values.get("project_id", str, required=True)
    account_file: str = values.get("service_account_file", str, required=True)
    endpoint: str = values.get("endpoint", str, FCM_ENDPOINT)
    parts = urlsplit(endpoint)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise values.error("endpoint", "must be an https:// URL")
    credentials = load_fcm(account_file, endpoint=endpoint, name=values.name("service_account_file"))
    # As Sygnal: the project pushed to is the configured one.
    return dataclasses.replace(credentials, project_id=project_id)


APP_TYPE = AppType(
    keys=frozenset({"api_version", "project_id", "service_account_file", "fcm_options", "max_connections"})
    | {"send_badge_counts", "api_key", "endpoint"},  # api_key: a legacy key left in the file, unused
    make=make_app,
)


def render_push(
    extras: FcmExtras, send_badge_counts: bool, notification: Notification, device: Device
) -> Push | None:
    """The push for a device; None when it would carry nothing: a badge-only update (no event, no
    room) of an app that sends no counts, as Sygnal discards it."""
    if not send_badge_counts and not notification.event_id and not notification.room_id:
        return None
    return Push(
        address=device.pushkey,
        payload=data_for(notification, device, send_badge_counts=send_badge_counts),
        kind=PushKind.BACKGROUND,  # a data message: the app decides what to show
        priority=Priority.NORMAL if notification.prio == "low" else Priority.HIGH,
        extras=extras,
    )


def data_for(n: Notification, device: Device, *, send_badge_counts: bool = True) -> dict[str, str]:
    data: dict[str, Any] = dict(device.data.get("default_payload") or {})
    for name in EVENT_FIELDS:
        data[name] = _cut(getattr(n, name))
    if isinstance(n.content, Mapping):
        data.update(
            {f"content_{key}": _cut(value) for key, value in n.content.items() if isinstance(value, str)}
        )
    data["prio"] = "normal" if n.prio == "low" else "high"
    if send_badge_counts and n.unread is not None:
        data["unread"] = str(n.unread)
    if send_badge_counts and n.missed_calls is not None:
        data["missed_calls"] = str(n.missed_calls)
    return {key: _text(value) for key, value in data.items() if value is not None}


def _cut(value: Any) -> Any:
    """A string over the field limit, cut at a character boundary and ended with "…"."""
    if not isinstance(value, str):
        return value
    raw = value.encode()
    if len(raw) <= MAX_BYTES_PER_FIELD:
        return value
    return raw[: MAX_BYTES_PER_FIELD - 3].decode(errors="ignore") + "…"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
