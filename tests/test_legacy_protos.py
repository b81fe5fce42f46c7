"""The node-go wire the legacy API reads: `MessageApi/SubscribeAll` and its `Envelope`, with the field
numbers of XMTP's own proto files (a renumbered field would read another network's bytes as ours).

Contract: docs/legacy.md#the-v3-message (the v3 messages' numbers are checked byte by byte in
tests/test_legacy_messages.py).
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor as F

from app.proto.xmtp.message_api.v1 import message_api_pb2 as api
from app.proto.xmtp.message_api.v1 import message_api_pb2_grpc as api_grpc


def test_the_envelope_fields() -> None:
    fields = [(f.number, f.type, f.name) for f in api.Envelope.DESCRIPTOR.fields]
    assert fields == [
        (1, F.TYPE_STRING, "content_topic"),
        (2, F.TYPE_UINT64, "timestamp_ns"),
        (3, F.TYPE_BYTES, "message"),
    ]
    assert api.Envelope.DESCRIPTOR.full_name == "xmtp.message_api.v1.Envelope"
    assert api.SubscribeAllRequest.DESCRIPTOR.fields == []


def test_subscribe_all_streams_envelopes() -> None:
    service = api.DESCRIPTOR.services_by_name["MessageApi"]
    method = service.methods_by_name["SubscribeAll"]
    assert service.full_name == "xmtp.message_api.v1.MessageApi"
    assert method.input_type.full_name == "xmtp.message_api.v1.SubscribeAllRequest"
    assert method.output_type.full_name == "xmtp.message_api.v1.Envelope"
    assert method.server_streaming and not method.client_streaming
    assert hasattr(api_grpc, "MessageApiStub")


def test_an_envelope_in_bytes() -> None:
    envelope = api.Envelope(content_topic="/t", timestamp_ns=2**63, message=b"m")
    assert envelope.SerializeToString() == b"\x0a\x02/t\x10" + bytes([0x80] * 9) + b"\x01\x1a\x01m"
