"""The legacy API's v3 message: read for eligibility, built from our envelopes, and its idempotency key.

Contract: docs/legacy.md#the-v3-message and docs/legacy.md#one-push-per-installation. The expected bytes
are written here from the field numbers the contract lists, with protobuf's wire rules, not with our
generated classes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace

import pytest

from app.envelopes.parsing import parse_json_batch
from app.envelopes.types import Envelope, EnvelopeKind
from app.fanout.fanout_job import encode_job
from app.legacy.messages import (
    MessageKind,
    ParsedMessage,
    envelope_idempotency_key,
    idempotency_key,
    parse,
    v3_message,
)
from app.network.decoding import decode
from app.proto.xmtp.mls.api.v1 import mls_pb2 as mls
from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as env

GROUP_ID = bytes(range(16))
GROUP_TOPIC = b"\x00" + GROUP_ID
GROUP_STRING = "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e0f/proto"
INSTALLATION_KEY = bytes(range(0x20, 0x40))
WELCOME_TOPIC = b"\x01" + INSTALLATION_KEY
WELCOME_STRING = f"/xmtp/mls/1/w-{INSTALLATION_KEY.hex()}/proto"
TIMESTAMP_NS = 1_741_283_556_527_942_000
SENDER_HMAC = bytes(range(100, 132))
VECTOR_B64 = "ClsIBxDw0s6AtIWSlRgaEAABAgMEBQYHCAkKCwwNDg8iF2xlZ2FjeSBwdXNoIHRlc3QgdmVjdG9yKiDTzaB7M+ug8QJgJdCBGTVL4OfjUgigUFy9j5p4/191tjAB"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), bytes length-delimited (wire type 2)."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


# --------------------------------------------------------------------------- parse


def test_a_group_message_is_read_for_its_data_hmac_and_flag() -> None:
    message = base64.b64decode(VECTOR_B64)
    parsed = parse(GROUP_STRING, message)
    assert parsed == ParsedMessage(
        MessageKind.GROUP,
        b"legacy push test vector",
        bytes.fromhex("d3cda07b33eba0f1026025d08119354be0e7e35208a0505cbd8f9a78ff5f75b6"),
        True,
    )


def test_a_group_message_without_should_push_says_false() -> None:
    message = field(1, field(4, b"data"))
    assert parse(GROUP_STRING, message) == ParsedMessage(MessageKind.GROUP, b"data", b"", False)


@pytest.mark.parametrize(
    "message",
    [b"\xff\xff\xff", b"", field(2, b"not v1"), b"\x0a\x05abc"],  # no v1, or bytes that do not decode
    ids=["garbage", "empty", "another version", "truncated"],
)
def test_a_group_topics_message_that_is_no_v1_is_unparsable(message: bytes) -> None:
    parsed = parse(GROUP_STRING, message)
    assert parsed.kind is MessageKind.UNPARSABLE and parsed.should_push is None


def test_a_welcome_topics_message_is_a_welcome_whatever_its_bytes() -> None:
    for message in (b"", b"\xff\xff", field(1, field(4, b"x"))):
        assert parse(WELCOME_STRING, message) == ParsedMessage(MessageKind.WELCOME)


def test_another_topics_message_is_unparsable() -> None:
    assert parse("/xmtp/0/invite-1/proto", base64.b64decode(VECTOR_B64)).kind is MessageKind.UNPARSABLE


# --------------------------------------------------------------------------- built from an envelope


def group_envelope(**changes: object) -> Envelope:
    values: dict[str, object] = {
        "topic": GROUP_TOPIC,
        "sequence_id": 7,
        "server_ns": TIMESTAMP_NS,
        "kind": EnvelopeKind.GROUP_MESSAGE,
        "should_push": True,
        "sender_hmac": bytes.fromhex("d3cda07b33eba0f1026025d08119354be0e7e35208a0505cbd8f9a78ff5f75b6"),
        "data": b"legacy push test vector",
    }
    values.update(changes)
    return Envelope(**values)  # type: ignore[arg-type]


def test_a_group_envelope_makes_the_vectors_message() -> None:
    assert v3_message(group_envelope()) == base64.b64decode(VECTOR_B64)


def test_a_commit_sets_is_commit_and_every_field_has_its_number() -> None:
    envelope = group_envelope(should_push=False, is_commit_or_proposal=True, sender_hmac=b"")
    v1 = (
        field(1, 7)
        + field(2, TIMESTAMP_NS)
        + field(3, GROUP_ID)
        + field(4, b"legacy push test vector")
        + field(7, 1)
    )
    assert v3_message(envelope) == field(1, v1)


def ingested(**fields: object) -> Envelope:
    """One envelope as ingest's JSON parses it: the group topic, sequence 7, the vector's time."""
    item = {
        "topic": base64.b64encode(GROUP_TOPIC).decode(),
        "sequence_id": "7",
        "server_ns": TIMESTAMP_NS,
        "kind": "group_message",
        **fields,
    }
    [envelope] = parse_json_batch({"envelopes": [item]})
    return envelope


def test_an_ingest_callers_message_is_used_as_it_is() -> None:
    envelope = ingested(message=base64.b64encode(b"given as it is").decode())
    assert envelope.v3_message == b"given as it is"
    assert v3_message(envelope) == b"given as it is"


def test_an_ingest_envelope_without_a_message_builds_it_from_its_fields() -> None:
    envelope = ingested(
        should_push=True,
        sender_hmac=base64.b64encode(group_envelope().sender_hmac).decode(),
        data=base64.b64encode(b"legacy push test vector").decode(),
    )
    assert envelope.v3_message == b""
    assert v3_message(envelope) == base64.b64decode(VECTOR_B64)


@pytest.mark.parametrize(
    "envelope",
    [
        group_envelope(kind=EnvelopeKind.OTHER),
        group_envelope(kind=EnvelopeKind.WELCOME),  # a welcome on a group topic
        group_envelope(topic=WELCOME_TOPIC),  # a group message on a welcome topic
        group_envelope(topic=b"\x02" + bytes(32)),  # an identity update's topic
        group_envelope(topic=b"\x00" + bytes(15)),
        group_envelope(topic=b"\x03" + bytes(16), v3_message=b"given"),
    ],
    ids=[
        "other",
        "welcome kind on a group topic",
        "group kind on a welcome topic",
        "kind 2",
        "short",
        "kind 3",
    ],
)
def test_kinds_without_a_legacy_form_have_no_message(envelope: Envelope) -> None:
    assert v3_message(envelope) is None


def from_xmtpd(client: env.ClientEnvelope, node: int, sequence: int) -> Envelope:
    """The envelope the xmtpd decoding makes of a client envelope, wrapped as a node sends it."""
    payer = env.PayerEnvelope(unsigned_client_envelope=client.SerializeToString())
    unsigned = env.UnsignedOriginatorEnvelope(
        originator_node_id=node,
        originator_sequence_id=sequence,
        originator_ns=TIMESTAMP_NS,
        payer_envelope_bytes=payer.SerializeToString(),
    )
    decoded = decode(env.OriginatorEnvelope(unsigned_originator_envelope=unsigned.SerializeToString()))
    assert decoded.envelope is not None
    return decoded.envelope


def xmtpd_welcome(payload: mls.WelcomeMessageInput, node: int = 100, sequence: int = 42) -> Envelope:
    aad = env.AuthenticatedData(target_topic=WELCOME_TOPIC)
    return from_xmtpd(env.ClientEnvelope(aad=aad, welcome_message=payload), node, sequence)


def test_an_xmtpd_welcome_keeps_its_input_and_becomes_a_welcome_v1() -> None:
    welcome = mls.WelcomeMessageInput.V1(
        installation_key=INSTALLATION_KEY,
        data=b"sealed welcome",
        hpke_public_key=b"hpke key",
        wrapper_algorithm=2,
        welcome_metadata=b"metadata",
    )
    envelope = xmtpd_welcome(mls.WelcomeMessageInput(v1=welcome))
    # The input's own numbers: 1 installation_key, 2 data, 3 hpke_public_key, 4 wrapper_algorithm, 7 metadata.
    assert envelope.welcome_input == field(
        1,
        field(1, INSTALLATION_KEY)
        + field(2, b"sealed welcome")
        + field(3, b"hpke key")
        + field(4, 2)
        + field(7, b"metadata"),
    )
    v1 = (
        field(1, 42)
        + field(2, TIMESTAMP_NS)
        + field(3, INSTALLATION_KEY)
        + field(4, b"sealed welcome")
        + field(5, b"hpke key")
        + field(6, 2)
        + field(7, b"metadata")
    )
    assert v3_message(envelope) == field(1, v1)


def test_an_xmtpd_welcome_pointer_becomes_a_welcome_pointer() -> None:
    pointer = mls.WelcomeMessageInput.WelcomePointer(
        installation_key=INSTALLATION_KEY,
        welcome_pointer=b"sealed pointer",
        hpke_public_key=b"k",
        wrapper_algorithm=2,
    )
    envelope = xmtpd_welcome(mls.WelcomeMessageInput(welcome_pointer=pointer))
    expected = (
        field(1, 42)
        + field(2, TIMESTAMP_NS)
        + field(3, INSTALLATION_KEY)
        + field(4, b"sealed pointer")
        + field(5, b"k")
        + field(6, 2)
    )
    assert v3_message(envelope) == field(2, expected)


def test_a_welcome_without_its_input_names_only_its_installation() -> None:
    envelope = Envelope(WELCOME_TOPIC, 42, TIMESTAMP_NS, EnvelopeKind.WELCOME)
    expected = field(1, 42) + field(2, TIMESTAMP_NS) + field(3, INSTALLATION_KEY)
    assert v3_message(envelope) == field(1, expected)


# --------------------------------------------------------------------------- idempotency keys


def test_the_vectors_idempotency_key() -> None:
    key = idempotency_key(GROUP_STRING, base64.b64decode(VECTOR_B64))
    assert key == "f674ca6c319e2677c05509d0a63336fcbfdb187f"


def test_the_key_is_sha1_of_the_topic_string_then_the_message() -> None:
    assert idempotency_key("t", b"m") == hashlib.sha1(b"tm").hexdigest()
    assert idempotency_key(GROUP_STRING, b"a") != idempotency_key(GROUP_STRING, b"b")


def test_an_xmtpd_envelopes_key_is_its_origin() -> None:
    envelope = xmtpd_welcome(mls.WelcomeMessageInput(), node=100, sequence=42)
    message = v3_message(envelope)
    assert message is not None
    assert envelope_idempotency_key(envelope, WELCOME_STRING, message) == "100:42"


def test_an_envelope_of_no_xmtpd_node_is_keyed_by_its_message() -> None:
    envelope = group_envelope()
    message = base64.b64decode(VECTOR_B64)
    key = envelope_idempotency_key(envelope, GROUP_STRING, message)
    assert key == "f674ca6c319e2677c05509d0a63336fcbfdb187f"


# --------------------------------------------------------------------------- read at enqueue time only


def test_the_legacy_fields_add_nothing_to_a_fan_out_job() -> None:
    plain = group_envelope()
    carrying = replace(plain, originator_node_id=100, welcome_input=b"w" * 500, v3_message=b"m" * 500)
    assert encode_job(carrying, 5) == encode_job(plain, 5)


def test_an_xmtpd_group_message_knows_its_originator() -> None:
    payload = mls.GroupMessageInput(v1=mls.GroupMessageInput.V1(data=b"d", should_push=True))
    aad = env.AuthenticatedData(target_topic=GROUP_TOPIC)
    envelope = from_xmtpd(env.ClientEnvelope(aad=aad, group_message=payload), 200, 9)
    assert envelope.originator_node_id == 200 and envelope.welcome_input == b""
    assert envelope_idempotency_key(envelope, GROUP_STRING, b"") == "200:9"
