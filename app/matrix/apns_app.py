"""The `apns` app type: its config keys, and a notification rendered as Sygnal renders it for APNs.

Two formats, chosen as Sygnal chooses: an event with an id and no type (what a homeserver sends
to an `event_id_only` pusher) is the pusher's `default_payload` with the ids and counts merged
in; anything else is the full format, an alert with `loc-key`/`loc-args` and a badge of unread
plus missed calls (a badge-only update when there is no event). Text fields are cut to 1024
characters, and the body to 4096 bytes (app.matrix.truncation). Pushkeys arrive base64 from
Matrix iOS clients and are sent as the hex token APNs expects, unless the app says otherwise. An
app with `send_badge_counts: false` sends no counts: no badge, no `unread_count` or `missed_calls`,
and no badge-only update at all.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aioapns.common import PushType

from app.core.channels import Channel
from app.delivery.credentials import ApnsCredentials, load_apns, load_apns_certificate
from app.delivery.types import ApnsExtras, OutcomeKind, Priority, Push, PushKind
from app.matrix.apps import AppType, AppValues, MatrixApp, RejectDevice
from app.matrix.notification import Device, Notification
from app.matrix.truncation import BodyTooLong, shortened_body

MAX_FIELD_LENGTH = 1024  # characters of a name or message shown in an alert
PLATFORMS = {"production": "production", "prod": "production", "sandbox": "sandbox"}
# The token is dead or not this app's: the homeserver should drop the pusher.
REJECTING = frozenset({OutcomeKind.DEAD, OutcomeKind.MISMATCH})


@dataclass(frozen=True, slots=True)
class ApnsOptions:
    push_type: str | None
    convert_device_token_to_hex: bool
    send_badge_counts: bool = True  # false: no badge, no unread_count or missed_calls (Sygnal 0.17)


def make_app(values: AppValues) -> MatrixApp:
    options = ApnsOptions(
        push_type=values.choice("push_type", [kind.value for kind in PushType]),
        convert_device_token_to_hex=values.get("convert_device_token_to_hex", bool, True),
        send_badge_counts=values.get("send_badge_counts", bool, True),
    )
    credentials = _credentials(values)
    render = functools.partial(render_push, options)
    return MatrixApp(values.app_id, "apns", Channel.APNS, credentials, render, REJECTING)


def _credentials(values: AppValues) -> ApnsCredentials:
    platform = values.choice("platform", PLATFORMS, "production")
    environment = PLATFORMS[platform or "production"]
    endpoint, ca_file = _endpoint(values), values.get("ca_file", str)
    certfile, topic = values.get("certfile", str), values.get("topic", str)
    if certfile:  # as Sygnal: a certificate, when given, is used
        names = {
            "cert_file": values.name("certfile"),
            "apns_topic": values.name("topic"),
            "ca_file": values.name("ca_file"),
        }
        return load_apns_certificate(
            certfile, topic, environment=environment, endpoint=endpoint, ca_file=ca_file, names=names
        )
    keyfile = values.get("keyfile", str)
    if not keyfile:
        raise values.error("keyfile", "required (or certfile, for certificate auth)")
    return load_apns(
        keyfile,
        values.get("key_id", str, required=True),
        values.get("team_id", str, required=True),
        values.get("topic", str, required=True),
        environment=environment,
        endpoint=endpoint,
        ca_file=ca_file,
        names={"key": values.name("keyfile"), "ca_file": values.name("ca_file")},
    )


def _endpoint(values: AppValues) -> str | None:
    endpoint: str | None = values.get("endpoint", str)
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme != "https" or not parts.hostname:
            raise values.error("endpoint", "must be an https:// URL")
    return endpoint


APP_TYPE = AppType(
    keys=frozenset(
        {"platform", "keyfile", "key_id", "team_id", "topic", "push_type", "convert_device_token_to_hex"}
        | {"certfile", "endpoint", "ca_file", "send_badge_counts"}
    ),
    make=make_app,
)


def render_push(options: ApnsOptions, notification: Notification, device: Device) -> Push | None:
    payload = payload_for(notification, device, send_badge_counts=options.send_badge_counts)
    if payload is None:
        return None
    try:
        body = shortened_body(payload)
    except BodyTooLong:
        raise RejectDevice("the pusher's default_payload does not fit in an APNs body") from None
    return Push(
        address=device_token(device.pushkey) if options.convert_device_token_to_hex else device.pushkey,
        payload=body,
        kind=PushKind.ALERT,
        priority=Priority.NORMAL if notification.prio == "low" else Priority.HIGH,
        extras=_extras(options.push_type),
    )


@functools.cache  # one per push type, not one made per push
def _extras(push_type: str | None) -> ApnsExtras:
    # No push_type configured: no apns-push-type header at all, as Sygnal sends it.
    return ApnsExtras(push_type=push_type, push_type_from_kind=False)


def device_token(pushkey: str) -> str:
    try:
        token = base64.b64decode(pushkey, validate=True)
    except (binascii.Error, ValueError):
        raise RejectDevice("pushkey is not base64") from None
    if not token:
        raise RejectDevice("pushkey is empty")
    return token.hex()


def payload_for(
    notification: Notification, device: Device, *, send_badge_counts: bool = True
) -> dict[str, Any] | None:
    """The APNs body; None when there is nothing to show (a badge-only update without its badge)."""
    default_payload = device.data.get("default_payload") or {}
    if notification.event_id and not notification.type:
        return event_id_only(notification, default_payload, send_badge_counts)
    return full(notification, default_payload, send_badge_counts)


def event_id_only(n: Notification, default_payload: dict[str, Any], counts: bool = True) -> dict[str, Any]:
    payload = dict(default_payload)
    if n.room_id:
        payload["room_id"] = n.room_id
    if n.event_id:
        payload["event_id"] = n.event_id
    if not counts:
        return payload
    if n.unread is not None:
        payload["unread_count"] = n.unread
    if n.missed_calls is not None:
        payload["missed_calls"] = n.missed_calls
    return payload


def full(n: Notification, default_payload: dict[str, Any], counts: bool = True) -> dict[str, Any] | None:
    loc_key, loc_args = alert_for(n)
    badge = badge_for(n) if counts else None
    if loc_key is None and badge is None:
        return None  # nothing to show
    payload: dict[str, Any] = copy.deepcopy(default_payload) if n.type else {}
    aps = payload.setdefault("aps", {})
    if not isinstance(aps, dict) or not isinstance(aps.get("alert", {}), dict):
        raise RejectDevice("the pusher's default_payload has an aps or aps.alert that is not an object")
    if loc_key:
        aps.setdefault("alert", {})["loc-key"] = loc_key
    if loc_args:
        aps.setdefault("alert", {})["loc-args"] = loc_args
    if badge is not None:
        aps["badge"] = badge
    if loc_key and n.room_id:
        payload["room_id"] = n.room_id
    if loc_key and n.event_id:
        payload["event_id"] = n.event_id
    return payload


def badge_for(n: Notification) -> int | None:
    if n.unread is None and n.missed_calls is None:
        return None
    return (n.unread or 0) + (n.missed_calls or 0)


def alert_for(n: Notification) -> tuple[str | None, list[Any] | None]:
    sender = _shown_sender(n)
    if n.type in ("m.room.message", "m.room.encrypted"):
        return _message_alert(n, sender)
    if n.type == "m.call.invite":
        return ("VIDEO_CALL_FROM_USER" if _is_video(n) else "VOICE_CALL_FROM_USER"), [sender]
    if n.type == "m.room.member":
        return _invite_alert(n, sender)
    if n.type:
        return "MSG_FROM_USER", [sender]  # a type we do not know, important enough to push
    return None, None


def _shown_sender(n: Notification) -> str:
    if not n.sender and not n.sender_display_name:
        shown = " "
    elif n.sender_display_name is not None:
        shown = n.sender_display_name
    else:
        shown = n.sender or " "
    return shown[:MAX_FIELD_LENGTH]


def _room_shown(n: Notification) -> str | None:
    room = n.room_name or n.room_alias
    return room[:MAX_FIELD_LENGTH] if room else None


def _message_alert(n: Notification, sender: str) -> tuple[str, list[Any]]:
    room = _room_shown(n)
    text, action, image = _message_content(n.content or {})
    if room:
        if image:
            return "IMAGE_FROM_USER_IN_ROOM", [sender, text, room]
        if text:
            return "MSG_FROM_USER_IN_ROOM_WITH_CONTENT", [sender, room, text]
        if action:
            return "ACTION_FROM_USER_IN_ROOM", [room, sender, action]
        return "MSG_FROM_USER_IN_ROOM", [sender, room]
    if image:
        return "IMAGE_FROM_USER", [sender, text]
    if text:
        return "MSG_FROM_USER_WITH_CONTENT", [sender, text]
    if action:
        return "ACTION_FROM_USER", [sender, action]
    return "MSG_FROM_USER", [sender]


def _message_content(content: Any) -> tuple[str | None, str | None, bool]:
    """(text shown, emote shown, is an image) of a message's content."""
    body, msgtype = content.get("body"), content.get("msgtype")
    if "msgtype" not in content or not isinstance(body, str):
        return None, None, False
    if msgtype == "m.emote":
        return None, body, False
    return body, None, msgtype == "m.image"


def _is_video(n: Notification) -> bool:
    offer = (n.content or {}).get("offer")
    sdp = offer.get("sdp") if isinstance(offer, dict) else None
    return isinstance(sdp, str) and "m=video" in sdp


def _invite_alert(n: Notification, sender: str) -> tuple[str | None, list[Any] | None]:
    if not n.user_is_target or n.membership != "invite":
        return None, None
    room = _room_shown(n)
    if room:
        return "USER_INVITE_TO_NAMED_ROOM", [sender, room]
    return "USER_INVITE_TO_CHAT", [sender]
