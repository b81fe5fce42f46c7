"""Calling the legacy notifications.v1 API as its clients do (iOS: Connect proto; Android: gRPC;
web and curl: Connect JSON), and reading what it stored."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from google.protobuf.message import Message
from sqlalchemy import text

from app.proto.notifications.v1 import service_pb2 as lpb
from tests.support import Api

SERVICE = "notifications.v1.Notifications"
TRANSPORTS = ("grpc", "json", "proto")
RESPONSES: dict[str, type[Message]] = {
    "RegisterInstallation": lpb.RegisterInstallationResponse,
    "DeleteInstallation": empty_pb2.Empty,
    "Subscribe": empty_pb2.Empty,
    "SubscribeWithMetadata": empty_pb2.Empty,
    "Unsubscribe": empty_pb2.Empty,
}
_METHODS = {
    lpb.RegisterInstallationRequest: "RegisterInstallation",
    lpb.DeleteInstallationRequest: "DeleteInstallation",
    lpb.SubscribeRequest: "Subscribe",
    lpb.SubscribeWithMetadataRequest: "SubscribeWithMetadata",
    lpb.UnsubscribeRequest: "Unsubscribe",
}


@dataclass(frozen=True)
class Refused:
    code: str  # the Connect name (invalid_argument), or the gRPC status's in lower case
    message: str
    status: int = 0  # Connect's HTTP status


def group(n: int) -> str:
    return f"/xmtp/mls/1/g-{n:032x}/proto"


def welcome(n: int) -> str:
    return f"/xmtp/mls/1/w-{n:064x}/proto"


def register_request(installation_id: str, **token: str) -> lpb.RegisterInstallationRequest:
    mechanism = lpb.DeliveryMechanism(**(token or {"apns_device_token": "a" * 64}))
    return lpb.RegisterInstallationRequest(installation_id=installation_id, delivery_mechanism=mechanism)


async def legacy_call(
    api: Api, transport: str, request: Message, method: str | None = None
) -> Message | Refused:
    name = method or _METHODS[type(request)]
    if transport == "grpc":
        return await _grpc(api, name, request.SerializeToString())
    if transport == "json":
        body = json.dumps(json_format.MessageToDict(request)).encode()
        return await connect(api, name, body, "application/json")
    return await connect(api, name, request.SerializeToString(), "application/proto")


async def _grpc(api: Api, method: str, body: bytes) -> Message | Refused:
    rpc = api.grpc_channel.unary_unary(
        f"/{SERVICE}/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        reply: bytes = await rpc(body, timeout=30)
    except grpc.aio.AioRpcError as error:
        return Refused(error.code().name.lower(), error.details() or "")
    return RESPONSES[method].FromString(reply)


async def connect(
    api: Api, method: str, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> Message | Refused:
    response = await api.http.post(
        f"/{SERVICE}/{method}", content=body, headers={"content-type": content_type, **(headers or {})}
    )
    if response.status_code != 200:
        error = response.json()
        return Refused(error.get("code", ""), error.get("message", ""), response.status_code)
    assert response.headers["content-type"].split(";")[0] == content_type
    reply = RESPONSES[method]()
    if content_type == "application/proto":
        reply.ParseFromString(response.content)
    else:
        json_format.ParseDict(response.json(), reply)
    return reply


async def stored(api: Api) -> dict[str, Any]:
    """Every legacy row, for "a refused request changes nothing" and for what a call stored."""
    tables = {
        "installations": "SELECT id, kind, token, registered_ns, deleted FROM legacy_installations ORDER BY id",
        "subscriptions": "SELECT installation_id, topic, active, is_silent, created_ns FROM legacy_subscriptions"
        " ORDER BY installation_id, topic",
        "keys": "SELECT installation_id, topic, period, key FROM legacy_hmac_keys ORDER BY installation_id, topic, period",
    }
    async with api.runtime.engine.connect() as connection:
        return {name: [tuple(r) for r in await connection.execute(text(sql))] for name, sql in tables.items()}


async def legacy_ok(http: Any, request: Message) -> Message:
    """Call the legacy API over Connect proto on `http` (an httpx client of the HTTP port), expecting
    an answer, not an error."""
    reply = await legacy_call(SimpleNamespace(http=http), "proto", request)  # type: ignore[arg-type]
    assert not isinstance(reply, Refused), reply
    return reply
