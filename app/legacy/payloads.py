"""One legacy delivery rendered as the delivery core's `Push`, per channel, in the exact bytes of
docs/legacy.md#payloads-channel-by-channel.

The delivery core sends what is rendered here and knows nothing of installations or messages: the
FCM document's own blocks travel as `FcmExtras.message_fields`, the HTTP delivery's `authorization` as
`WebhookExtras.headers`, and the operator's endpoint is a webhook app whose answers never remove it
(`http_delivery_config`).
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from app.core.apps import AppName, AppSource
from app.core.channels import Channel
from app.delivery.providers.webhook import MAX_PER_HOST, WebhookConfig
from app.delivery.registry import CHANNELS
from app.delivery.types import ApnsExtras, FcmExtras, Priority, Push, PushKind, WebhookExtras
from app.delivery.url_policy import UrlPolicy
from app.legacy import topics

DEFAULT_ALERT_TEXT = "New message from XMTP"
EPOCH = datetime.fromtimestamp(0, UTC)  # a time no body shows (see deliveries.render)
# The webhook app the HTTP delivery goes through: the operator's endpoint, apart from receivers'.
HTTP_DELIVERY_APP = AppName(AppSource.SETTINGS, "legacy-http")


class LegacyDelivery(NamedTuple):
    """One message for one installation, through one of its subscriptions. (A tuple: one is made per
    attempt, and a tuple costs a fraction of a frozen dataclass to make.)"""

    topic: str  # the subscription's legacy topic string
    message: bytes  # the serialized v3 message
    timestamp_ns: int  # the network's time of the envelope
    idempotency_key: str
    installation_id: str
    mechanism: str  # the installation's token kind: "apns", "fcm" or "custom"
    token: str
    is_silent: bool
    created_at: datetime  # the subscription's creation
    should_push: bool | None  # None for welcomes and unparsable messages


@dataclass(frozen=True, slots=True)
class PayloadSettings:
    """What the payloads take from the deployment's settings."""

    alert_text: str = DEFAULT_ALERT_TEXT  # XMTP_PUSH_LEGACY_ALERT_TEXT
    bundle_id: str | None = None  # apns-topic; None: the APNs credentials' own
    http_url: str | None = None  # XMTP_PUSH_LEGACY_HTTP_DELIVERY_URL
    http_authorization: str | None = None  # XMTP_PUSH_LEGACY_HTTP_DELIVERY_AUTHORIZATION
    http_signing_key: bytes | None = None  # XMTP_PUSH_LEGACY_HTTP_DELIVERY_SIGNING_KEY, decoded


DEFAULT_PAYLOADS = PayloadSettings()


def channel_for(mechanism: str, *, apns: bool, fcm: bool, http: bool) -> Channel | None:
    """The first channel that fits an installation's token kind, given which are configured (`http`:
    the HTTP delivery, the only one for a `custom` token); None when none does."""
    if mechanism == "apns" and apns:
        return Channel.APNS
    if mechanism == "fcm" and fcm:
        return Channel.FCM
    return Channel.HTTP if http else None


def http_delivery_config(max_per_host: int = MAX_PER_HOST) -> WebhookConfig:
    """The HTTP delivery's webhook configuration: the operator's own URL, so `http://`, loopback and
    private hosts are allowed, and no answer says it is gone."""
    policy = UrlPolicy(allow_insecure=True, allow_private_addresses=True)
    return WebhookConfig(policy, max_per_host, gone_is_dead=False)


# --------------------------------------------------------------------------- JSON as Go writes it


def go_string(value: str) -> str:
    """A JSON string as Go's encoding/json writes it: UTF-8 as it is, and `<`, `>`, `&`, U+2028 and
    U+2029 escaped (the Go server's bytes, for a receiver that compares them)."""
    written = json.dumps(value, ensure_ascii=False)
    if any(c in value for c in _GO_ESCAPES):
        for char, escaped in _GO_ESCAPES.items():
            written = written.replace(char, escaped)
    return written


_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _b64(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


@functools.lru_cache(maxsize=4096)
def _kind(topic: str) -> str:
    """The topic's message kind (made once per topic: every subscriber of an envelope shares it)."""
    kind = topics.message_kind(topic)
    if kind is None:  # such a subscription is stored and never matched
        raise ValueError("a legacy delivery needs a group or welcome topic")
    return kind


@functools.lru_cache(maxsize=4096)
def _topic_json(topic: str) -> str:
    """The topic as a JSON string, made once per topic."""
    return go_string(topic)


def rfc3339(moment: datetime) -> str:
    """UTC with a `Z`, fractions of a second only when there are any (as Go's RFC3339Nano)."""
    utc = moment.astimezone(UTC) if moment.tzinfo is not None else moment
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


# --------------------------------------------------------------------------- APNs


@functools.lru_cache(maxsize=16)
def _aps(alert_text: str) -> tuple[str, str]:
    """The `aps` objects (alert, silent) for an alert text, written once."""
    return f'{{"alert":{go_string(alert_text)},"mutable-content":1}}', '{"content-available":1}'


@functools.lru_cache(maxsize=16)
def _apns_extras(bundle_id: str | None) -> ApnsExtras | None:
    return ApnsExtras(apns_topic=bundle_id) if bundle_id else None


def apns_push(delivery: LegacyDelivery, settings: PayloadSettings) -> Push:
    """An alert (priority 10) or, silent, a background push (priority 5); no collapse id: each push
    carries its own message."""
    alert, silent = _aps(settings.alert_text)
    aps = silent if delivery.is_silent else alert
    topic = delivery.topic
    body = (
        f'{{"aps":{aps},"encryptedMessage":"{_b64(delivery.message)}",'
        f'"messageKind":"{_kind(topic)}","topic":{_topic_json(topic)}}}'
    )
    kind, priority = _kind_and_priority(delivery)
    return Push(delivery.token, body.encode(), kind, priority, extras=_apns_extras(settings.bundle_id))


def _kind_and_priority(delivery: LegacyDelivery) -> tuple[PushKind, Priority]:
    if delivery.is_silent:
        return PushKind.BACKGROUND, Priority.NORMAL
    return PushKind.ALERT, Priority.HIGH


# --------------------------------------------------------------------------- FCM

_SILENT_APNS_HEADERS = {"apns-push-type": "background", "apns-priority": "5"}


def fcm_push(delivery: LegacyDelivery, settings: PayloadSettings) -> Push:
    """The data map on every platform: Android's priority and data, a web notification titled with the
    alert text, and the APNs payload an iOS app on FCM decrypts (`messageType`, not `messageKind`)."""
    data = {
        "topic": delivery.topic,
        "encryptedMessage": _b64(delivery.message),
        "messageType": _kind(delivery.topic),
    }
    silent = delivery.is_silent
    fields: dict[str, Any] = {
        "android": {"data": data},
        "webpush": {"data": data, "notification": {"title": settings.alert_text}},
        "apns": {
            "headers": dict(_SILENT_APNS_HEADERS) if silent else {},
            "payload": {"aps": {"content-available": 1} if silent else {"mutable-content": 1}, **data},
        },
    }
    kind, priority = _kind_and_priority(delivery)
    extras = FcmExtras(apns_block=False, message_fields=fields)
    return Push(delivery.token, data, kind, priority, extras=extras)


# --------------------------------------------------------------------------- the HTTP delivery


def http_body(delivery: LegacyDelivery) -> bytes:
    """The Go server's document, field for field and in its order; `timestamp_ns` an exact integer,
    an empty message and a missing `should_push` left out."""
    topic = go_string(delivery.topic)
    message = f',"message":"{_b64(delivery.message)}"' if delivery.message else ""
    should_push = "" if delivery.should_push is None else f',"should_push":{_bool(delivery.should_push)}'
    return (
        f'{{"idempotency_key":{go_string(delivery.idempotency_key)},'
        f'"message":{{"content_topic":{topic},"timestamp_ns":{int(delivery.timestamp_ns)}{message}}},'
        f'"message_context":{{"message_type":"{_kind(delivery.topic)}"{should_push}}},'
        f'"installation":{{"id":{go_string(delivery.installation_id)},'
        f'"delivery_mechanism":{{"kind":{go_string(delivery.mechanism)},"token":{go_string(delivery.token)}}}}},'
        f'"subscription":{{"created_at":"{rfc3339(delivery.created_at)}","topic":{topic},'
        f'"is_silent":{_bool(delivery.is_silent)}}}}}'
    ).encode()


def _bool(value: bool) -> str:
    return "true" if value else "false"


def delivery_id(delivery: LegacyDelivery) -> str:
    """The webhook-id of a signed delivery: one per message and installation, the same for each attempt."""
    material = f"{delivery.idempotency_key}\n{delivery.installation_id}".encode()
    return "msg_" + hashlib.sha256(material).hexdigest()[:32]


@functools.lru_cache(maxsize=16)
def _webhook_extras(signing_key: bytes | None, authorization: str | None) -> WebhookExtras:
    headers = (("authorization", authorization),) if authorization else ()
    return WebhookExtras(signing_key, headers)


def http_push(delivery: LegacyDelivery, settings: PayloadSettings) -> Push:
    if not settings.http_url:
        raise ValueError("the HTTP delivery is not configured")
    key = settings.http_signing_key
    return Push(
        settings.http_url,
        http_body(delivery),
        PushKind.BACKGROUND,
        Priority.NORMAL,
        message_id=delivery_id(delivery) if key else None,
        extras=_webhook_extras(key, settings.http_authorization),
    )


Renderer = Callable[[LegacyDelivery, PayloadSettings], Push]
RENDERERS: dict[Channel, Renderer] = {
    Channel.APNS: apns_push,
    Channel.FCM: fcm_push,
    Channel.HTTP: http_push,
}


def render(channel: Channel, delivery: LegacyDelivery, settings: PayloadSettings) -> Push:
    """The push of a delivery on its channel (`channel_for`)."""
    return RENDERERS[channel](delivery, settings)


def refused_for_size(
    channel: Channel, topic: str, message: bytes, is_silent: bool, settings: PayloadSettings
) -> bool:
    """Whether the channel refuses, for its size, the push of `message` to any of the topic's
    subscriptions of that silence: the installation's id and token never count towards the limits
    (not in the APNs body; only the HTTP delivery, which has none, carries them)."""
    descriptor = CHANNELS[channel]
    if descriptor.max_payload_bytes is None:
        return False
    probe = LegacyDelivery(topic, message, 0, "", "", "", "", is_silent, EPOCH, None)
    return descriptor.refuses_size_of(render(channel, probe, settings))
