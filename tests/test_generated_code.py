"""The committed protobuf/gRPC modules match their .proto files, and the wire contract holds.

The contract is the one XMTP SDKs depend on (field numbers, types and names of
xmtp.backend.v1 and the gRPC method paths); renumbering or retyping a field
breaks real clients even when every other test passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from app.api.calls import METHODS
from app.proto import generate as proto_generate
from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc as pb_grpc

PACKAGE = "xmtp.backend.v1"
SERVICE = f"{PACKAGE}.NotificationService"

F = FieldDescriptor
# message -> [(number, type, name, message or enum type's full name, repeated, oneof)]
MESSAGES: dict[str, list[tuple[int, int, str, str | None, bool, str | None]]] = {
    "ApnsDelivery": [(1, F.TYPE_STRING, "token", None, False, None)],
    "FcmDelivery": [(1, F.TYPE_STRING, "token", None, False, None)],
    "HttpDelivery": [
        (1, F.TYPE_STRING, "url", None, False, None),
        (2, F.TYPE_BYTES, "signing_key", None, False, None),
    ],
    "RegisterRequest": [
        (1, F.TYPE_BYTES, "recipient_id", None, False, None),
        (2, F.TYPE_BYTES, "recipient_secret", None, False, None),
        (3, F.TYPE_MESSAGE, "apns", f"{PACKAGE}.ApnsDelivery", False, "delivery"),
        (4, F.TYPE_MESSAGE, "fcm", f"{PACKAGE}.FcmDelivery", False, "delivery"),
        (5, F.TYPE_MESSAGE, "http", f"{PACKAGE}.HttpDelivery", False, "delivery"),
        (6, F.TYPE_BYTES, "metadata", None, False, None),
    ],
    "UnregisterRequest": [
        (1, F.TYPE_BYTES, "recipient_id", None, False, None),
        (2, F.TYPE_BYTES, "recipient_secret", None, False, None),
    ],
    "UnregisterResponse": [],
    "UpdateSubscriptionsRequest": [
        (1, F.TYPE_BYTES, "recipient_id", None, False, None),
        (2, F.TYPE_BYTES, "recipient_secret", None, False, None),
        (3, F.TYPE_MESSAGE, "adds", f"{PACKAGE}.Subscription", True, None),
        (4, F.TYPE_BYTES, "removes", None, True, None),
    ],
    "Subscription": [
        (1, F.TYPE_BYTES, "topic", None, False, None),
        (2, F.TYPE_INT64, "hmac_epoch_base", None, False, None),
        (3, F.TYPE_BYTES, "hmac_keys", None, True, None),
        (4, F.TYPE_BOOL, "include_commits", None, False, None),
    ],
    "RecipientState": [
        (1, F.TYPE_UINT64, "topic_count", None, False, None),
        (2, F.TYPE_ENUM, "channel", f"{PACKAGE}.Channel", False, None),
        (3, F.TYPE_INT64, "expires_at_ns", None, False, None),
    ],
}
CHANNEL_VALUES = {"CHANNEL_UNSPECIFIED": 0, "CHANNEL_APNS": 1, "CHANNEL_FCM": 2, "CHANNEL_HTTP": 3}
# method -> (path, request, response)
RPCS = {
    "Register": (f"/{SERVICE}/Register", "RegisterRequest", "RecipientState"),
    "Unregister": (f"/{SERVICE}/Unregister", "UnregisterRequest", "UnregisterResponse"),
    "UpdateSubscriptions": (
        f"/{SERVICE}/UpdateSubscriptions",
        "UpdateSubscriptionsRequest",
        "RecipientState",
    ),
}


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    root = proto_generate.PROTO_ROOT
    fresh = {path.relative_to(tmp_path): path for path in proto_generate.generate(tmp_path)}
    committed = {path.relative_to(root): path for path in proto_generate.generated_files(root)}
    hint = "run `make proto` and commit the result"
    assert fresh, "protoc generated nothing"
    missing = sorted(str(name) for name in fresh.keys() - committed.keys())
    assert not missing, f"generated modules not committed under app/proto: {missing}; {hint}"
    stale = sorted(str(name) for name in committed.keys() - fresh.keys())
    assert not stale, f"modules under app/proto with no .proto source: {stale}; delete them or {hint}"
    differing = sorted(
        str(name) for name, path in fresh.items() if path.read_bytes() != committed[name].read_bytes()
    )
    assert not differing, f"committed generated code differs from its .proto: {differing}; {hint}"


def test_file_is_proto3_in_the_sdk_package() -> None:
    assert pb.DESCRIPTOR.package == PACKAGE
    assert pb.DESCRIPTOR.name == "xmtp/backend/v1/notification.proto"


def test_channel_enum_values() -> None:
    channel = pb.DESCRIPTOR.enum_types_by_name["Channel"]
    assert {value.name: value.number for value in channel.values} == CHANNEL_VALUES


def _describe(descriptor: Descriptor) -> list[tuple[Any, ...]]:
    rows = []
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        nested = field.message_type or field.enum_type
        oneof = field.containing_oneof
        rows.append(
            (
                field.number,
                field.type,
                field.name,
                nested.full_name if nested is not None else None,
                field.is_repeated,
                oneof.name if oneof is not None else None,
            )
        )
    return rows


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_fields(name: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name.get(name)
    assert descriptor is not None, f"message {PACKAGE}.{name} is missing"
    assert descriptor.full_name == f"{PACKAGE}.{name}"
    assert _describe(descriptor) == MESSAGES[name]


def test_no_unexpected_messages() -> None:
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(MESSAGES)


def test_register_delivery_oneof_and_optional_metadata() -> None:
    descriptor = pb.RegisterRequest.DESCRIPTOR
    assert [oneof.name for oneof in descriptor.oneofs] == ["delivery"]
    assert [field.name for field in descriptor.oneofs_by_name["delivery"].fields] == ["apns", "fcm", "http"]
    # Absent metadata decodes as empty: older SDKs send it, newer ones do not.
    assert pb.RegisterRequest.FromString(b"").metadata == b""


def test_service_methods_in_descriptor() -> None:
    service = pb.DESCRIPTOR.services_by_name["NotificationService"]
    assert service.full_name == SERVICE
    found = {
        method.name: (
            f"/{service.full_name}/{method.name}",
            method.input_type.name,
            method.output_type.name,
            method.client_streaming,
            method.server_streaming,
        )
        for method in service.methods
    }
    assert found == {name: (*rpc, False, False) for name, rpc in RPCS.items()}


class _RecordingChannel:
    """Stands in for grpc.Channel and records the paths the generated stub binds."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def unary_unary(self, path: str, **_: Any) -> str:
        self.paths[path.rsplit("/", 1)[1]] = path
        return path

    def _other(self, *_: Any, **__: Any) -> None:
        raise AssertionError("NotificationService methods are all unary")

    unary_stream = stream_unary = stream_stream = _other


def test_generated_stub_paths() -> None:
    channel = _RecordingChannel()
    pb_grpc.NotificationServiceStub(channel)
    assert channel.paths == {name: rpc[0] for name, rpc in RPCS.items()}


def test_served_method_paths_and_types() -> None:
    served = {
        name: (method.path, method.request_type.DESCRIPTOR.name, method.response_type.DESCRIPTOR.name)
        for name, method in METHODS.items()
    }
    assert served == RPCS
