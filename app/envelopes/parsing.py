"""Envelopes from the ingest wire formats: a JSON batch, or one protobuf ServerEnvelope.

Errors name the field (`envelopes[3].sequence_id`) and never echo its value.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError

from app.envelopes.types import UINT64_MAX, Envelope, EnvelopeKind
from app.proto.xmtp.backend.v1 import envelope_pb2

MAX_BATCH = 1000
MAX_TOPIC_BYTES = 256
_PAYLOAD_KINDS = {"group_message": EnvelopeKind.GROUP_MESSAGE, "welcome_message": EnvelopeKind.WELCOME}


class EnvelopeError(ValueError):
    """An envelope or batch is refused; the message names the field at fault."""


def parse_json_batch(document: Any) -> list[Envelope]:
    """All or nothing: one bad envelope refuses the whole batch."""
    if not isinstance(document, Mapping) or not isinstance(document.get("envelopes"), list):
        raise EnvelopeError("envelopes: must be a list")
    items = document["envelopes"]
    if not 1 <= len(items) <= MAX_BATCH:
        raise EnvelopeError(f"envelopes: must hold 1 to {MAX_BATCH} envelopes")
    return [_parse_json_envelope(item, f"envelopes[{index}]") for index, item in enumerate(items)]


def _parse_json_envelope(item: Any, where: str) -> Envelope:
    if not isinstance(item, Mapping):
        raise EnvelopeError(f"{where}: must be an object")
    kind = item.get("kind")
    if not isinstance(kind, str) or kind not in {k.value for k in EnvelopeKind}:
        raise EnvelopeError(f"{where}.kind: must be one of group_message, welcome, other")
    return Envelope(
        topic=_topic(_base64(item, "topic", where, required=True), where),
        sequence_id=_decimal_uint64(item, where),
        server_ns=_uint64(item, "server_ns", where),
        kind=EnvelopeKind(kind),
        should_push=_bool(item, "should_push", where),
        is_commit_or_proposal=_bool(item, "is_commit_or_proposal", where),
        sender_hmac=_base64(item, "sender_hmac", where),
        data=_base64(item, "data", where),
        v3_message=_base64(item, "message", where),
    )


def _base64(item: Mapping[str, Any], name: str, where: str, *, required: bool = False) -> bytes:
    value = item.get(name)
    if value is None and not required:
        return b""
    if not isinstance(value, str):
        raise EnvelopeError(f"{where}.{name}: must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"{where}.{name}: must be a base64 string") from None


def _topic(topic: bytes, where: str) -> bytes:
    if not 1 <= len(topic) <= MAX_TOPIC_BYTES:
        raise EnvelopeError(f"{where}.topic: must be 1 to {MAX_TOPIC_BYTES} bytes")
    return topic


def _decimal_uint64(item: Mapping[str, Any], where: str) -> int:
    value = item.get("sequence_id")
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 20:
        raise EnvelopeError(f"{where}.sequence_id: must be a decimal string")
    number = int(value)
    if number > UINT64_MAX:
        raise EnvelopeError(f"{where}.sequence_id: must fit in 64 bits")
    return number


def _uint64(item: Mapping[str, Any], name: str, where: str) -> int:
    value = item.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT64_MAX:
        raise EnvelopeError(f"{where}.{name}: must be an unsigned 64-bit integer")
    return value


def _bool(item: Mapping[str, Any], name: str, where: str) -> bool:
    value = item.get(name, False)
    if not isinstance(value, bool):
        raise EnvelopeError(f"{where}.{name}: must be true or false")
    return value


def parse_server_envelope(body: bytes) -> Envelope:
    """One serialized xmtp.backend.v1.ServerEnvelope."""
    try:
        message = envelope_pb2.ServerEnvelope.FromString(body)
    except DecodeError:
        raise EnvelopeError("ServerEnvelope: does not decode") from None
    if not message.HasField("meta"):
        raise EnvelopeError("ServerEnvelope.meta: is required")
    meta = message.meta
    payload = message.envelope.WhichOneof("payload")
    group = message.envelope.group_message
    return Envelope(
        topic=_topic(meta.topic.topic, "ServerEnvelope.meta"),
        sequence_id=meta.cursor.sequence_id,
        server_ns=meta.server_ns,
        kind=_PAYLOAD_KINDS.get(payload or "", EnvelopeKind.OTHER),
        should_push=group.should_push,
        is_commit_or_proposal=meta.is_commit_or_proposal,
        sender_hmac=group.sender_hmac,
        data=group.data,
    )
