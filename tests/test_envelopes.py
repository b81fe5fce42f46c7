"""Envelope parsing (JSON batches and protobuf ServerEnvelopes) and the fan-out job's encoding.

Contract: docs/hints.md#envelopes-that-wake-a-device, docs/api.md#ingest (`POST /v1/envelopes`).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from app.envelopes.parsing import (
    MAX_BATCH,
    MAX_TOPIC_BYTES,
    EnvelopeError,
    parse_json_batch,
    parse_server_envelope,
)
from app.envelopes.types import UINT64_MAX, Envelope, EnvelopeKind
from app.fanout.fanout_job import FanoutJob
from app.proto.xmtp.backend.v1 import envelope_pb2 as pb

TOPIC = b"\x01" + bytes(range(16))
TOPIC_B64 = base64.b64encode(TOPIC).decode()
SENDER_HMAC = bytes(range(32))
DATA = b"mls-ciphertext\x00\xff"


def good(**changes: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "topic": TOPIC_B64,
        "sequence_id": "9007199254740993",
        "server_ns": 1_700_000_000_000_000_000,
        "kind": "group_message",
        "should_push": True,
        "is_commit_or_proposal": False,
        "sender_hmac": base64.b64encode(SENDER_HMAC).decode(),
        "data": base64.b64encode(DATA).decode(),
    }
    item.update(changes)
    return {key: value for key, value in item.items() if value is not _MISSING}


_MISSING: Any = object()


def batch(*items: dict[str, Any]) -> dict[str, Any]:
    return {"envelopes": list(items)}


def refused(document: Any) -> str:
    with pytest.raises(EnvelopeError) as caught:
        parse_json_batch(document)
    return str(caught.value)


# ---- JSON batches: what is accepted --------------------------------------------------------------------


def test_full_group_message_is_parsed() -> None:
    [envelope] = parse_json_batch(batch(good()))
    assert envelope == Envelope(
        topic=TOPIC,
        sequence_id=9007199254740993,
        server_ns=1_700_000_000_000_000_000,
        kind=EnvelopeKind.GROUP_MESSAGE,
        should_push=True,
        is_commit_or_proposal=False,
        sender_hmac=SENDER_HMAC,
        data=DATA,
    )


def test_optional_fields_default_to_empty_and_false() -> None:
    item = {"topic": TOPIC_B64, "sequence_id": "7", "server_ns": 0, "kind": "welcome"}
    [envelope] = parse_json_batch(batch(item))
    assert envelope.kind is EnvelopeKind.WELCOME
    assert (envelope.should_push, envelope.is_commit_or_proposal) == (False, False)
    assert (envelope.sender_hmac, envelope.data) == (b"", b"")


def test_null_byte_fields_mean_absent() -> None:
    [envelope] = parse_json_batch(batch(good(sender_hmac=None, data=None)))
    assert (envelope.sender_hmac, envelope.data) == (b"", b"")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("group_message", EnvelopeKind.GROUP_MESSAGE),
        ("welcome", EnvelopeKind.WELCOME),
        ("other", EnvelopeKind.OTHER),
    ],
)
def test_every_kind_value(kind: str, expected: EnvelopeKind) -> None:
    assert parse_json_batch(batch(good(kind=kind)))[0].kind is expected


def test_batch_keeps_order() -> None:
    items = [good(sequence_id=str(n)) for n in (5, 3, 9)]
    assert [e.sequence_id for e in parse_json_batch(batch(*items))] == [5, 3, 9]


@pytest.mark.parametrize("size", [1, MAX_BATCH])
def test_batch_size_limits_accepted(size: int) -> None:
    assert len(parse_json_batch(batch(*[good()] * size))) == size


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("1", 1), (str(UINT64_MAX), UINT64_MAX), ("007", 7)])
def test_sequence_id_uint64_range(text: str, number: int) -> None:
    assert parse_json_batch(batch(good(sequence_id=text)))[0].sequence_id == number


@pytest.mark.parametrize("value", [0, UINT64_MAX])
def test_server_ns_uint64_range(value: int) -> None:
    assert parse_json_batch(batch(good(server_ns=value)))[0].server_ns == value


@pytest.mark.parametrize("size", [1, MAX_TOPIC_BYTES])
def test_topic_size_limits_accepted(size: int) -> None:
    topic = b"\x02" * size
    item = good(topic=base64.b64encode(topic).decode())
    assert parse_json_batch(batch(item))[0].topic == topic


# ---- JSON batches: what is refused, and how ------------------------------------------------------------


@pytest.mark.parametrize("document", [[], "x", None, 3, {}, {"envelopes": {}}, {"envelopes": "a"}])
def test_document_shape(document: Any) -> None:
    assert refused(document).startswith("envelopes:")


@pytest.mark.parametrize("size", [0, MAX_BATCH + 1])
def test_batch_size_limits_refused(size: int) -> None:
    message = refused(batch(*[good()] * size))
    assert message.startswith("envelopes:")
    assert str(MAX_BATCH) in message


SECRET = "s3cr3t-VALUE-do-not-echo"


# (field, bad value) -> the field named in the message. The bad value embeds SECRET wherever it can.
BAD_FIELDS: list[tuple[str, Any]] = [
    ("topic", _MISSING),
    ("topic", None),
    ("topic", 12),
    ("topic", SECRET),  # not base64 (has '-')
    ("topic", "AQI"),  # missing padding
    ("topic", "AQ=ID"),  # padding inside
    ("topic", "AQ ID"),  # whitespace is not base64
    ("topic", "ÄQID"),  # non-ASCII
    ("topic", ""),  # empty topic
    ("topic", base64.b64encode(b"\x01" * (MAX_TOPIC_BYTES + 1)).decode()),
    ("sequence_id", _MISSING),
    ("sequence_id", 5),  # must travel as text
    ("sequence_id", None),
    ("sequence_id", ""),
    ("sequence_id", "-1"),
    ("sequence_id", "+1"),
    ("sequence_id", "1.0"),
    ("sequence_id", "1e3"),
    ("sequence_id", " 1"),
    ("sequence_id", "١٢٣"),  # Arabic-Indic digits: isdigit() but not ASCII
    ("sequence_id", SECRET),
    ("sequence_id", str(UINT64_MAX + 1)),
    ("sequence_id", "9" * 21),
    ("server_ns", _MISSING),
    ("server_ns", None),
    ("server_ns", "1700000000"),
    ("server_ns", 1.5),
    ("server_ns", True),
    ("server_ns", -1),
    ("server_ns", UINT64_MAX + 1),
    ("kind", _MISSING),
    ("kind", None),
    ("kind", SECRET),
    ("kind", "welcome_message"),  # the protobuf name, not the JSON value
    ("kind", "GROUP_MESSAGE"),
    ("kind", 1),
    ("kind", ["group_message"]),
    ("kind", {"k": SECRET}),
    ("should_push", "true"),
    ("should_push", 1),
    ("should_push", None),
    ("is_commit_or_proposal", 0),
    ("is_commit_or_proposal", SECRET),
    ("sender_hmac", SECRET),
    ("sender_hmac", 5),
    ("sender_hmac", ["AQID"]),
    ("data", SECRET),
    ("data", "AQI"),  # missing padding
    ("data", {"b": "AQID"}),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_bad_field_is_named_and_not_echoed(field: str, value: Any) -> None:
    message = refused(batch(good(), good(**{field: value})))
    assert message.startswith(f"envelopes[1].{field}: ")
    assert SECRET not in message


def test_one_bad_envelope_refuses_the_whole_batch() -> None:
    message = refused(batch(good(), good(), good(), good(sequence_id="x")))
    assert message.startswith("envelopes[3].sequence_id:")


@pytest.mark.parametrize("item", [None, [], "x", 5])
def test_envelope_must_be_an_object(item: Any) -> None:
    assert refused(batch(good(), item)) == "envelopes[1]: must be an object"


# ---- protobuf ServerEnvelope ---------------------------------------------------------------------------


def server_envelope(**payload: Any) -> pb.ServerEnvelope:
    return pb.ServerEnvelope(
        meta=pb.EnvelopeMeta(
            cursor=pb.Cursor(sequence_id=UINT64_MAX),
            server_ns=1_700_000_000_123_456_789,
            message_hash=pb.MessageHash(sha256=b"\x11" * 32),
            topic=pb.Topic(topic=TOPIC),
            expiry_ns=1_800_000_000_000_000_000,
            is_commit_or_proposal=False,
        ),
        envelope=pb.ClientEnvelope(**payload),
    )


def test_server_envelope_group_message() -> None:
    message = server_envelope(
        group_message=pb.GroupMessage(data=DATA, sender_hmac=SENDER_HMAC, should_push=True)
    )
    envelope = parse_server_envelope(message.SerializeToString())
    assert envelope == Envelope(
        topic=TOPIC,
        sequence_id=UINT64_MAX,
        server_ns=1_700_000_000_123_456_789,
        kind=EnvelopeKind.GROUP_MESSAGE,
        should_push=True,
        is_commit_or_proposal=False,
        sender_hmac=SENDER_HMAC,
        data=DATA,
    )


def test_server_envelope_commit() -> None:
    message = server_envelope(group_message=pb.GroupMessage(data=DATA))
    message.meta.is_commit_or_proposal = True
    envelope = parse_server_envelope(message.SerializeToString())
    assert envelope.kind is EnvelopeKind.GROUP_MESSAGE
    assert envelope.is_commit_or_proposal is True
    assert envelope.should_push is False


def test_server_envelope_welcome() -> None:
    envelope = parse_server_envelope(server_envelope(welcome_message=pb.WelcomeMessage()).SerializeToString())
    assert envelope.kind is EnvelopeKind.WELCOME
    assert (envelope.sender_hmac, envelope.data, envelope.should_push) == (b"", b"", False)


@pytest.mark.parametrize("payload", ["key_package", "identity_update", "commit_log_entry"])
def test_server_envelope_other_payloads(payload: str) -> None:
    message = server_envelope(**{payload: getattr(pb, _message_name(payload))()})
    assert parse_server_envelope(message.SerializeToString()).kind is EnvelopeKind.OTHER


def test_server_envelope_without_payload_is_other() -> None:
    message = server_envelope()
    message.ClearField("envelope")
    assert parse_server_envelope(message.SerializeToString()).kind is EnvelopeKind.OTHER


def _message_name(field: str) -> str:
    return "".join(part.capitalize() for part in field.split("_"))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def test_server_envelope_skips_fields_it_does_not_know() -> None:
    """Real welcome and key package bodies are not declared in our proto: they must be skipped."""
    cursor = _field(1, b"\x08\x07")  # Cursor { sequence_id: 7 }
    topic = _field(4, _field(1, TOPIC))
    server_ns = b"\x10" + _varint(42)
    meta = topic + server_ns + cursor + _field(99, b"future meta field")
    welcome_body = _field(1, b"opaque welcome ciphertext") + b"\x10\x05" + _field(7, b"more")
    wire = _field(1, meta) + _field(2, _field(2, welcome_body)) + _field(15, b"unknown top-level field")
    envelope = parse_server_envelope(wire)
    assert envelope.kind is EnvelopeKind.WELCOME
    assert envelope.topic == TOPIC
    assert envelope.sequence_id == 7
    assert envelope.server_ns == 42


@pytest.mark.parametrize(
    "body", [b"\xff", b"\x0a", b"\x0a\x05ab", b"\x08\x80", b"garbage bytes!!", b"\x0a\xff\xff\xff\xff\x0f"]
)
def test_server_envelope_garbage_is_refused(body: bytes) -> None:
    with pytest.raises(EnvelopeError):
        parse_server_envelope(body)


def test_server_envelope_without_meta_is_refused() -> None:
    message = pb.ServerEnvelope(envelope=pb.ClientEnvelope(group_message=pb.GroupMessage(should_push=True)))
    with pytest.raises(EnvelopeError, match=r"^ServerEnvelope\.meta: "):
        parse_server_envelope(message.SerializeToString())


def test_empty_body_is_refused() -> None:
    with pytest.raises(EnvelopeError, match=r"^ServerEnvelope\.meta: "):
        parse_server_envelope(b"")


def test_server_envelope_without_topic_is_refused() -> None:
    message = server_envelope(welcome_message=pb.WelcomeMessage())
    message.meta.ClearField("topic")
    with pytest.raises(EnvelopeError, match=r"^ServerEnvelope\.meta\.topic: "):
        parse_server_envelope(message.SerializeToString())


def test_server_envelope_topic_too_long_is_refused() -> None:
    message = server_envelope(welcome_message=pb.WelcomeMessage())
    message.meta.topic.topic = b"\x01" * (MAX_TOPIC_BYTES + 1)
    with pytest.raises(EnvelopeError, match=r"^ServerEnvelope\.meta\.topic: "):
        parse_server_envelope(message.SerializeToString())


# ---- FanoutJob -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "envelope",
    [
        Envelope(
            topic=TOPIC,
            sequence_id=UINT64_MAX,
            server_ns=UINT64_MAX,
            kind=EnvelopeKind.GROUP_MESSAGE,
            should_push=True,
            is_commit_or_proposal=True,
            sender_hmac=SENDER_HMAC,
            data=bytes(range(256)),
            received_ns=1_700_000_000_000_000_001,
        ),
        Envelope(topic=b"\x00", sequence_id=0, server_ns=0, kind=EnvelopeKind.WELCOME),
        Envelope(topic=b"\x05" * 256, sequence_id=1, server_ns=2, kind=EnvelopeKind.OTHER, received_ns=3),
    ],
)
@pytest.mark.parametrize("after", [b"", b"\xaa" * 32])
def test_fanout_job_round_trip(envelope: Envelope, after: bytes) -> None:
    job = FanoutJob(envelope, after)
    decoded = FanoutJob.decode(job.encode())
    assert decoded == job
    assert decoded.first_page is (after == b"")


def test_fanout_job_encoding_is_compact_json() -> None:
    encoded = FanoutJob(
        Envelope(topic=b"\x01\x02\x03", sequence_id=9, server_ns=1, kind=EnvelopeKind.WELCOME)
    ).encode()
    assert b" " not in encoded
    assert b'"t":"AQID"' in encoded
    assert b'"s":"9"' in encoded  # sequence ids travel as text
