"""XMTP hints rendered as pushes: `<topic, sequence_id>` in each channel's exact wire form.

Contract: docs/hints.md#the-payload-channel-by-channel. The delivery core sends what is rendered here and knows
nothing of topics or recipients; the wire tests pin these bytes.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Callable
from typing import NamedTuple

from app.core.channels import Channel
from app.delivery.types import Priority, Push, PushKind, WebhookExtras
from app.recipients.types import Target


class Hint(NamedTuple):
    """A wake-up hint: `<topic, sequence_id>`, never content, for one recipient."""

    topic: bytes
    sequence_id: int
    recipient_id: bytes


def _b64(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


def apns_push(hint: Hint, target: Target) -> Push:
    """A background push (priority 5, as Apple requires), collapsed per topic. The body is what
    json.dumps(..., ensure_ascii=False) writes for it: base64 and digits need no escaping."""
    topic = _b64(hint.topic)
    body = f'{{"aps": {{"content-available": 1}}, "topic": "{topic}", "sequence_id": "{hint.sequence_id}"}}'
    return Push(target.address, body.encode(), PushKind.BACKGROUND, Priority.NORMAL, collapse_id=topic)


def fcm_push(hint: Hint, target: Target) -> Push:
    """Data only, high priority on Android (a data message at normal priority may wait for the
    device's next maintenance window); background at priority 5 for iOS apps on FCM."""
    data = {"topic": _b64(hint.topic), "sequence_id": str(hint.sequence_id)}
    return Push(target.address, data, PushKind.BACKGROUND, Priority.HIGH)


def webhook_body(hint: Hint) -> bytes:
    """The exact bytes that are signed and sent."""
    topic = _b64(hint.topic)
    return f'{{"topic":"{topic}","sequence_id":"{hint.sequence_id}","recipient_id":"{hint.recipient_id.hex()}"}}'.encode()


def webhook_id(hint: Hint) -> str:
    """Stable for every attempt at the same hint, so receivers can dedupe on it."""
    digest = hashlib.sha256(hint.recipient_id + hint.topic + hint.sequence_id.to_bytes(8, "big")).hexdigest()
    return f"hint_{digest[:32]}"


def webhook_push(hint: Hint, target: Target) -> Push:
    return Push(
        target.address,
        webhook_body(hint),
        PushKind.BACKGROUND,
        Priority.NORMAL,
        message_id=webhook_id(hint),
        extras=WebhookExtras(target.signing_key) if target.signing_key else None,
    )


Renderer = Callable[[Hint, Target], Push]
RENDERERS: dict[Channel, Renderer] = {
    Channel.APNS: apns_push,
    Channel.FCM: fcm_push,
    Channel.HTTP: webhook_push,
}
