"""From an xmtpd OriginatorEnvelope down to what the push pipeline needs."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from app.envelopes.types import Envelope, EnvelopeKind
from app.network.mls import is_commit_or_proposal
from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as pb

TOPIC_KIND_GROUP = 0
TOPIC_KIND_WELCOME = 1
# Topic kind byte -> metric label; kinds 0 and 1 are the only pushable ones.
TOPIC_KINDS = {
    0: "group_message",
    1: "welcome",
    2: "identity_update",
    3: "key_package",
    4: "payer_report",
    5: "payer_report_attestation",
}


class MalformedEnvelope(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class NetworkEnvelope:
    originator_node_id: int
    originator_sequence_id: int
    originator_ns: int
    kind: str  # metric label: group_message, welcome, identity_update, ...
    envelope: Envelope | None  # None when nothing of it can be pushed

    @property
    def key(self) -> tuple[int, int]:
        return self.originator_node_id, self.originator_sequence_id


def decode(originator: pb.OriginatorEnvelope) -> NetworkEnvelope:
    """Unwrap every layer; raises MalformedEnvelope when a layer does not decode."""
    try:
        unsigned = pb.UnsignedOriginatorEnvelope.FromString(originator.unsigned_originator_envelope)
        payer = pb.PayerEnvelope.FromString(unsigned.payer_envelope_bytes)
        client = pb.ClientEnvelope.FromString(payer.unsigned_client_envelope)
    except DecodeError:
        raise MalformedEnvelope from None
    topic = client.aad.target_topic
    if not topic:
        raise MalformedEnvelope
    kind = TOPIC_KINDS.get(topic[0], "other")
    return NetworkEnvelope(
        unsigned.originator_node_id,
        unsigned.originator_sequence_id,
        unsigned.originator_ns,
        kind,
        _pushable(client, topic, unsigned),
    )


def _pushable(client: pb.ClientEnvelope, topic: bytes, unsigned: pb.UnsignedOriginatorEnvelope) -> Envelope | None:
    payload = client.WhichOneof("payload")
    server_ns = max(0, unsigned.originator_ns)
    if topic[0] == TOPIC_KIND_WELCOME and payload == "welcome_message":
        return Envelope(topic, unsigned.originator_sequence_id, server_ns, EnvelopeKind.WELCOME)
    if topic[0] != TOPIC_KIND_GROUP or payload != "group_message":
        return None
    if client.group_message.WhichOneof("version") != "v1":
        return None
    v1 = client.group_message.v1
    return Envelope(
        topic,
        unsigned.originator_sequence_id,
        server_ns,
        EnvelopeKind.GROUP_MESSAGE,
        should_push=v1.should_push,
        is_commit_or_proposal=is_commit_or_proposal(v1.data),
        sender_hmac=v1.sender_hmac,
        data=v1.data,
    )
