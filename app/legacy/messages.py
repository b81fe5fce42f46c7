"""The legacy API's messages: a v3 message read for eligibility, built from an envelope, and the key
that lets one envelope reach each installation once.

Contract: docs/legacy.md#the-v3-message. A legacy subscriber's SDK decodes the message it is pushed as
the v3 network (node-go) stored it: a `GroupMessage` on a group topic, a `WelcomeMessage` on a
welcome topic. An envelope from xmtpd or ingest carries the parts of it; this module puts them back
together.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from app.envelopes.types import Envelope, EnvelopeKind
from app.legacy import topics
from app.proto.xmtp.mls.api.v1 import mls_pb2 as mls

_group_from_bytes = mls.GroupMessage.FromString
_welcome_input_from_bytes = mls.WelcomeMessageInput.FromString


class MessageKind(enum.Enum):
    GROUP = "group"
    WELCOME = "welcome"
    UNPARSABLE = "unparsable"  # a group topic's message that is no GroupMessage V1, or another topic's


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What eligibility reads of a message; `should_push` is None where the message has none."""

    kind: MessageKind
    data: bytes = b""
    sender_hmac: bytes = b""
    should_push: bool | None = None


WELCOME = ParsedMessage(MessageKind.WELCOME)
UNPARSABLE = ParsedMessage(MessageKind.UNPARSABLE)


def parse(topic: str, message: bytes) -> ParsedMessage:
    """A welcome topic's message is a welcome whatever its bytes; a group topic's is read as a
    `GroupMessage` V1, and anything else is unparsable (docs/legacy.md#eligibility)."""
    kind = topics.message_kind(topic)
    if kind == topics.WELCOME:
        return WELCOME
    if kind != topics.CONVERSATION:
        return UNPARSABLE
    try:
        group = _group_from_bytes(message)
    except DecodeError:
        return UNPARSABLE
    if group.WhichOneof("version") != "v1":
        return UNPARSABLE
    v1 = group.v1
    return ParsedMessage(MessageKind.GROUP, v1.data, v1.sender_hmac, v1.should_push)


def v3_message(envelope: Envelope) -> bytes | None:
    """The serialized v3 message of an envelope, or None when it has no legacy form (its topic is no
    group or welcome topic, or its kind does not fit its topic). A message the ingest caller gave is
    used as it is."""
    topic = envelope.topic
    if not topic or topics.to_string(topic) is None:
        return None
    if envelope.v3_message:
        return envelope.v3_message
    if topic[0] == topics.GROUP_KIND and envelope.kind is EnvelopeKind.GROUP_MESSAGE:
        return _group_message(envelope)
    if topic[0] == topics.WELCOME_KIND and envelope.kind is EnvelopeKind.WELCOME:
        return _welcome_message(envelope)
    return None


def _group_message(envelope: Envelope) -> bytes:
    v1 = mls.GroupMessage.V1(
        id=envelope.sequence_id,
        created_ns=envelope.server_ns,
        group_id=envelope.topic[1:],
        data=envelope.data,
        sender_hmac=envelope.sender_hmac,
        should_push=envelope.should_push,
        is_commit=envelope.is_commit_or_proposal,
    )
    return mls.GroupMessage(v1=v1).SerializeToString()


def _welcome_message(envelope: Envelope) -> bytes:
    """The welcome's input with the envelope's position and time. Without an input that decodes (an
    ingest caller's welcome), a V1 naming only its installation: the push still wakes the device,
    whose SDK then reads its welcomes from the network."""
    ids = {"id": envelope.sequence_id, "created_ns": envelope.server_ns}
    try:
        given = _welcome_input_from_bytes(envelope.welcome_input)
    except DecodeError:
        given = mls.WelcomeMessageInput()
    version = given.WhichOneof("version")
    if version == "welcome_pointer":
        pointer = given.welcome_pointer
        return mls.WelcomeMessage(
            welcome_pointer=mls.WelcomeMessage.WelcomePointer(
                **ids,
                installation_key=pointer.installation_key or envelope.topic[1:],
                welcome_pointer=pointer.welcome_pointer,
                hpke_public_key=pointer.hpke_public_key,
                wrapper_algorithm=pointer.wrapper_algorithm,
            )
        ).SerializeToString()
    v1 = given.v1  # the empty V1 when the input has none
    return mls.WelcomeMessage(
        v1=mls.WelcomeMessage.V1(
            **ids,
            installation_key=v1.installation_key or envelope.topic[1:],
            data=v1.data,
            hpke_public_key=v1.hpke_public_key,
            wrapper_algorithm=v1.wrapper_algorithm,
            welcome_metadata=v1.welcome_metadata,
        )
    ).SerializeToString()


def idempotency_key(content_topic: str, message: bytes) -> str:
    """hex(SHA-1(topic string ‖ message)): the same for every copy of one message, whichever listener
    read it (docs/legacy.md#one-push-per-installation)."""
    return hashlib.sha1(content_topic.encode() + message, usedforsecurity=False).hexdigest()


def envelope_idempotency_key(envelope: Envelope, content_topic: str, message: bytes) -> str:
    """An xmtpd envelope's key is its origin, `<originator_node_id>:<originator_sequence_id>`, as the
    Go server's xmtpd listener names it; every other envelope's is `idempotency_key`."""
    node = envelope.originator_node_id
    if node is not None:
        return f"{node}:{envelope.sequence_id}"
    return idempotency_key(content_topic, message)
