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


# Bound once: decode() runs for every envelope on the network.
_unsigned_from_bytes = pb.UnsignedOriginatorEnvelope.FromString
_payer_from_bytes = pb.PayerEnvelope.FromString
_client_from_bytes = pb.ClientEnvelope.FromString


def decode(originator: pb.OriginatorEnvelope) -> NetworkEnvelope:
    """Unwrap every layer; raises MalformedEnvelope when a layer does not decode."""
    try:
        unsigned = _unsigned_from_bytes(originator.unsigned_originator_envelope)
        payer = _payer_from_bytes(unsigned.payer_envelope_bytes)
        client = _client_from_bytes(payer.unsigned_client_envelope)
    except DecodeError:
        raise MalformedEnvelope from None
    topic = client.aad.target_topic
    if not topic:
        raise MalformedEnvelope
    sequence, originator_ns = unsigned.originator_sequence_id, unsigned.originator_ns
    node = unsigned.originator_node_id
    return NetworkEnvelope(
        node,
        sequence,
        originator_ns,
        TOPIC_KINDS.get(topic[0], "other"),
        _pushable(client, topic, node, sequence, originator_ns),
    )


def _pushable(
    client: pb.ClientEnvelope, topic: bytes, node: int, sequence: int, originator_ns: int
) -> Envelope | None:
    payload = client.WhichOneof("payload")
    server_ns = originator_ns if originator_ns > 0 else 0
    if topic[0] == TOPIC_KIND_WELCOME and payload == "welcome_message":
        # Serialized again only for welcomes: the legacy API sends their fields on.
        welcome = client.welcome_message.SerializeToString()
        return Envelope(
            topic, sequence, server_ns, EnvelopeKind.WELCOME, originator_node_id=node, welcome_input=welcome
        )
    if topic[0] != TOPIC_KIND_GROUP or payload != "group_message":
        return None
    group_message = client.group_message
    if group_message.WhichOneof("version") != "v1":
        return None
    v1 = group_message.v1
    data = v1.data
    return Envelope(
        topic,
        sequence,
        server_ns,
        EnvelopeKind.GROUP_MESSAGE,
        v1.should_push,
        is_commit_or_proposal(data),
        v1.sender_hmac,
        data,
        originator_node_id=node,
    )
