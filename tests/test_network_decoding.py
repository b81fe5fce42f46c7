"""From a serialized xmtpd OriginatorEnvelope down to the pipeline's Envelope.

Contract: docs/xmtp-network.md#what-the-listener-reads (envelope nesting, ids and time, commits). Every envelope is
built with the real nested layers (fakes/fake_xmtpd.py) and parsed back from its bytes, as the
listener gets it off the wire.
"""

from __future__ import annotations

import os

import pytest

from app.envelopes.types import EnvelopeKind
from app.network.decoding import MalformedEnvelope, NetworkEnvelope, decode
from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as env
from fakes.fake_xmtpd import (
    APPLICATION,
    COMMIT,
    PROPOSAL,
    UNDECODABLE,
    Item,
    commit_message,
    garbage,
    group_message,
    group_topic,
    identity_update,
    key_package,
    originator_envelope,
    private_message,
    proposal_message,
    public_message,
    welcome_message,
    welcome_topic,
)

NS = 1_767_225_600_123_456_789
HMAC = bytes(range(32))


def decoded(item: Item) -> NetworkEnvelope:
    return decode(env.OriginatorEnvelope.FromString(item.raw))


def client_for(topic: bytes) -> env.ClientEnvelope:
    return env.ClientEnvelope(aad=env.AuthenticatedData(target_topic=topic))


# --- group messages ---------------------------------------------------------------------------------


def test_group_message_every_field() -> None:
    topic = group_topic()
    data = private_message(APPLICATION, group_id=topic[1:], ciphertext_size=200)
    item = group_message(100, 4242, topic, data=data, sender_hmac=HMAC, should_push=True, originator_ns=NS)
    result = decoded(item)
    assert (result.originator_node_id, result.originator_sequence_id, result.originator_ns) == (100, 4242, NS)
    assert result.key == (100, 4242)
    assert result.kind == "group_message"
    envelope = result.envelope
    assert envelope is not None
    assert envelope.topic == topic
    assert envelope.sequence_id == 4242  # the originator's sequence id is the hint's
    assert envelope.server_ns == NS  # originator_ns decides the HMAC epoch
    assert envelope.kind is EnvelopeKind.GROUP_MESSAGE
    assert envelope.should_push is True
    assert envelope.is_commit_or_proposal is False
    assert envelope.sender_hmac == HMAC
    assert envelope.data == data
    assert envelope.received_ns == 0  # stamped when queued, not when decoded


def test_group_message_should_push_false() -> None:
    envelope = decoded(group_message(1, 1, group_topic(), should_push=False)).envelope
    assert envelope is not None
    assert envelope.should_push is False
    assert envelope.is_commit_or_proposal is False


def test_group_message_without_hmac_or_data() -> None:
    envelope = decoded(group_message(1, 2, group_topic(), data=b"", sender_hmac=b"")).envelope
    assert envelope is not None
    assert (envelope.data, envelope.sender_hmac, envelope.is_commit_or_proposal) == (b"", b"", False)


def test_commit_from_originator_zero_with_blockchain_proof() -> None:
    topic = group_topic()
    item = commit_message(0, 77, topic)
    assert item.envelope.WhichOneof("proof") == "blockchain_proof"
    result = decoded(item)
    assert result.key == (0, 77)
    assert result.kind == "group_message"
    assert result.envelope is not None
    assert result.envelope.is_commit_or_proposal is True
    assert result.envelope.should_push is False
    assert result.envelope.topic == topic


@pytest.mark.parametrize("sender_type", [1, 2, 3, 4])
def test_proposals_and_commits_with_each_sender_type(sender_type: int) -> None:
    topic = group_topic()
    for builder in (commit_message, proposal_message):
        envelope = decoded(builder(0, 5, topic, sender_type=sender_type)).envelope
        assert envelope is not None and envelope.is_commit_or_proposal is True


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (private_message(APPLICATION), False),
        (private_message(PROPOSAL), True),
        (private_message(COMMIT), True),
        (public_message(APPLICATION, sender_type=1), False),
        (public_message(COMMIT, sender_type=4), True),
        (b"\x00\x01\x00\x03" + os.urandom(50), False),  # a Welcome
        (os.urandom(3), False),
        (UNDECODABLE, False),
    ],
)
def test_commit_flag_comes_from_the_framing(data: bytes, expected: bool) -> None:
    envelope = decoded(group_message(9, 1, group_topic(), data=data, should_push=True)).envelope
    assert envelope is not None
    assert envelope.is_commit_or_proposal is expected
    assert envelope.data == data  # garbage framing still travels on (fail open)


def test_large_sequence_ids_and_negative_timestamps() -> None:
    item = group_message(2**32 - 1, 2**64 - 1, group_topic(), originator_ns=-5)
    result = decoded(item)
    assert result.key == (2**32 - 1, 2**64 - 1)
    assert result.originator_ns == -5
    assert result.envelope is not None and result.envelope.server_ns == 0


def test_group_message_without_a_version_is_not_pushable() -> None:
    client = client_for(group_topic())
    client.group_message.SetInParent()
    result = decoded(originator_envelope(3, 3, client))
    assert result.kind == "group_message"
    assert result.envelope is None


# --- welcomes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pointer", [False, True])
def test_welcome(pointer: bool) -> None:
    topic = welcome_topic()
    result = decoded(welcome_message(200, 31, topic, pointer=pointer, originator_ns=NS))
    assert result.kind == "welcome"
    assert result.key == (200, 31)
    envelope = result.envelope
    assert envelope is not None
    assert (envelope.topic, envelope.sequence_id, envelope.server_ns) == (topic, 31, NS)
    assert envelope.kind is EnvelopeKind.WELCOME
    assert (envelope.sender_hmac, envelope.data, envelope.is_commit_or_proposal) == (b"", b"", False)


# --- what is not pushable ------------------------------------------------------------------------------


def test_identity_update_is_counted_not_pushed() -> None:
    result = decoded(identity_update(5, 6))
    assert (result.kind, result.envelope, result.key) == ("identity_update", None, (5, 6))


def test_key_package_is_counted_not_pushed() -> None:
    result = decoded(key_package(5, 7))
    assert (result.kind, result.envelope, result.key) == ("key_package", None, (5, 7))


@pytest.mark.parametrize(
    ("kind_byte", "label"),
    [(4, "payer_report"), (5, "payer_report_attestation"), (6, "other"), (0xFF, "other")],
)
def test_other_topic_kinds(kind_byte: int, label: str) -> None:
    client = client_for(bytes([kind_byte]) + os.urandom(16))
    if kind_byte == 4:
        client.payer_report.SetInParent()
    elif kind_byte == 5:
        client.payer_report_attestation.SetInParent()
    result = decoded(originator_envelope(1, 1, client))
    assert (result.kind, result.envelope) == (label, None)


@pytest.mark.parametrize("payload", ["welcome", "identity", "none"])
def test_group_topic_with_another_payload_is_not_pushable(payload: str) -> None:
    client = client_for(group_topic())
    if payload == "welcome":
        client.welcome_message.v1.SetInParent()
    elif payload == "identity":
        client.identity_update.SetInParent()
    result = decoded(originator_envelope(1, 1, client))
    assert (result.kind, result.envelope) == ("group_message", None)


def test_welcome_topic_with_a_group_message_is_not_pushable() -> None:
    client = client_for(welcome_topic())
    client.group_message.v1.data = private_message(APPLICATION)
    client.group_message.v1.should_push = True
    result = decoded(originator_envelope(1, 1, client))
    assert (result.kind, result.envelope) == ("welcome", None)


# --- what does not decode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["unsigned", "payer", "client", "no_topic"])
def test_garbage_layers_are_malformed(layer: str) -> None:
    with pytest.raises(MalformedEnvelope):
        decoded(garbage(1, 1, layer))


def test_empty_envelope_is_malformed() -> None:
    with pytest.raises(MalformedEnvelope):
        decode(env.OriginatorEnvelope())


def test_truncated_nested_bytes_are_malformed() -> None:
    raw = group_message(1, 1, group_topic()).envelope.unsigned_originator_envelope
    with pytest.raises(MalformedEnvelope):
        decode(env.OriginatorEnvelope(unsigned_originator_envelope=raw[: len(raw) // 2]))
