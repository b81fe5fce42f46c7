"""Request builders and transport-neutral calls shared by the API tests.

`call(api, transport, method, request)` sends one request over real gRPC
("grpc"), Connect JSON ("json") or Connect binary ("proto") and returns either
the decoded reply or a `Failure(code, message)`; Connect failures are also
checked against Connect's HTTP status for their code. `snapshot(api)` reads
every stored row, so a test can prove that a refused request changed nothing.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import secrets
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from sqlalchemy import select

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.recipients.models import Recipient, Subscription
from tests.support import Api

SERVICE = "xmtp.backend.v1.NotificationService"
RESPONSE_TYPES: dict[str, type[Message]] = {
    "Register": pb.RecipientState,
    "Unregister": pb.UnregisterResponse,
    "UpdateSubscriptions": pb.RecipientState,
}
# Connect's unary HTTP status for each error code (connectrpc.com/docs/protocol).
CONNECT_HTTP_STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "out_of_range": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "resource_exhausted": 429,
    "internal": 500,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
TRANSPORTS = ("grpc", "json")
ALL_TRANSPORTS = ("grpc", "json", "proto")

MALFORMED = "request is malformed"
NOT_REGISTERED = "recipient is not registered"
BAD_SECRET = "recipient secret is not valid"
# Row 4's message is the contract's constant; what configures the channel goes to the log alone.
NOT_CONFIGURED_MESSAGE = "channel is not configured"
NOT_CONFIGURED = dict.fromkeys(("apns", "fcm", "http"), NOT_CONFIGURED_MESSAGE)
URL_NOT_ALLOWED = "webhook url is not allowed"
KEY_LENGTH = "webhook signing key length is not allowed"
SUBSCRIPTION_MALFORMED = "subscription is malformed"
TOPIC_LIMIT = "recipient topic limit reached"

TTL_DEFAULT_NS = 2_592_000 * 1_000_000_000
HOOK_URL = "https://127.0.0.1:8443/hook"
SIGNING_KEY = b"k" * 32
_topic_counter = itertools.count(1)


@dataclass(frozen=True)
class Failure:
    code: str
    message: str


@dataclass(frozen=True)
class Creds:
    rid: bytes
    secret: bytes


# --- values ---------------------------------------------------------------


def new_creds() -> Creds:
    return Creds(secrets.token_bytes(32), secrets.token_bytes(32))


def group_topic() -> bytes:
    """A fresh, valid group-message topic (kind 0x00 + 16 bytes)."""
    return b"\x00" + next(_topic_counter).to_bytes(16, "big")


def welcome_topic() -> bytes:
    """A fresh, valid welcome topic (kind 0x01 + 32 bytes)."""
    return b"\x01" + next(_topic_counter).to_bytes(32, "big")


def hmac_key(fill: int = 7) -> bytes:
    return bytes([fill]) * 42


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# --- requests -------------------------------------------------------------


def fcm(token: str = "fcm-token") -> dict[str, Any]:
    return {"fcm": pb.FcmDelivery(token=token)}


def apns(token: str = "apns-token") -> dict[str, Any]:
    return {"apns": pb.ApnsDelivery(token=token)}


def http(url: str = HOOK_URL, signing_key: bytes = SIGNING_KEY) -> dict[str, Any]:
    return {"http": pb.HttpDelivery(url=url, signing_key=signing_key)}


def register(
    creds: Creds, delivery: dict[str, Any] | None = None, metadata: bytes = b""
) -> pb.RegisterRequest:
    delivery = fcm() if delivery is None else delivery
    return pb.RegisterRequest(
        recipient_id=creds.rid, recipient_secret=creds.secret, metadata=metadata, **delivery
    )


def unregister(creds: Creds) -> pb.UnregisterRequest:
    return pb.UnregisterRequest(recipient_id=creds.rid, recipient_secret=creds.secret)


def sub(topic: bytes, base: int = 0, keys: tuple[bytes, ...] = (), commits: bool = False) -> pb.Subscription:
    return pb.Subscription(topic=topic, hmac_epoch_base=base, hmac_keys=list(keys), include_commits=commits)


def update(
    creds: Creds, adds: list[pb.Subscription] | None = None, removes: list[bytes] | None = None
) -> pb.UpdateSubscriptionsRequest:
    return pb.UpdateSubscriptionsRequest(
        recipient_id=creds.rid, recipient_secret=creds.secret, adds=adds or [], removes=removes or []
    )


def adds_of(*topics: bytes) -> list[pb.Subscription]:
    return [sub(topic) for topic in topics]


def method_of(request: Message) -> str:
    return {
        "RegisterRequest": "Register",
        "UnregisterRequest": "Unregister",
        "UpdateSubscriptionsRequest": "UpdateSubscriptions",
    }[request.DESCRIPTOR.name]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- calls ----------------------------------------------------------------


async def call(api: Api, transport: str, request: Message, **options: Any) -> Any:
    """The reply message, or a Failure with the error's code name and message."""
    method = method_of(request)
    if transport == "grpc":
        return await _grpc_call(api, method, request, **options)
    if transport == "json":
        body = json.dumps(json_format.MessageToDict(request)).encode()
        return await connect_post(api, method, body, "application/json", **options)
    if transport == "proto":
        return await connect_post(api, method, request.SerializeToString(), "application/proto", **options)
    raise AssertionError(f"unknown transport {transport}")


async def _grpc_call(api: Api, method: str, request: Message, timeout: float | None = None) -> Any:
    try:
        return await getattr(api.stub, method)(request, timeout=timeout)
    except grpc.aio.AioRpcError as error:
        return Failure(error.code().name.lower(), error.details() or "")


async def grpc_raw(api: Api, method: str, body: bytes) -> bytes | Failure:
    """Send arbitrary bytes as the request body of a real gRPC call."""
    rpc = api.grpc_channel.unary_unary(
        f"/{SERVICE}/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        reply: bytes = await rpc(body)
    except grpc.aio.AioRpcError as error:
        return Failure(error.code().name.lower(), error.details() or "")
    return reply


async def connect_post(
    api: Api, method: str, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> Any:
    response = await api.http.post(
        f"/{SERVICE}/{method}", content=body, headers={"content-type": content_type, **(headers or {})}
    )
    if response.status_code == 200:
        assert response.headers["content-type"].startswith(content_type)
        reply = RESPONSE_TYPES[method]()
        if content_type == "application/proto":
            reply.ParseFromString(response.content)
        else:
            json_format.ParseDict(response.json(), reply)
        return reply
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()
    assert set(error) <= {"code", "message", "details"}
    assert response.status_code == CONNECT_HTTP_STATUS[error["code"]], (response.status_code, error)
    return Failure(error["code"], error.get("message", ""))


async def ok(api: Api, transport: str, request: Message, **options: Any) -> Any:
    """Call and require success; returns the reply."""
    reply = await call(api, transport, request, **options)
    assert not isinstance(reply, Failure), reply
    return reply


# --- stored state ---------------------------------------------------------

RECIPIENT_COLUMNS = (
    Recipient.id,
    Recipient.secret_hash,
    Recipient.channel,
    Recipient.target,
    Recipient.signing_key,
    Recipient.topic_count,
    Recipient.created_ns,
    Recipient.renewed_ns,
)
SUBSCRIPTION_COLUMNS = (
    Subscription.recipient_id,
    Subscription.topic,
    Subscription.start_ns,
    Subscription.hmac_epoch_base,
    Subscription.hmac_keys,
    Subscription.include_commits,
)


@dataclass(frozen=True)
class Snapshot:
    recipients: tuple[tuple[Any, ...], ...]
    subscriptions: tuple[tuple[Any, ...], ...]


async def snapshot(api: Api) -> Snapshot:
    """Every stored recipient and subscription row, in a stable order."""
    async with api.runtime.sessions() as session:
        recipients = await session.execute(select(*RECIPIENT_COLUMNS).order_by(Recipient.id))
        subscriptions = await session.execute(
            select(*SUBSCRIPTION_COLUMNS).order_by(Subscription.recipient_id, Subscription.topic)
        )
        return Snapshot(tuple(map(tuple, recipients)), tuple(map(tuple, subscriptions)))


async def recipient_row(api: Api, rid: bytes) -> Recipient | None:
    async with api.runtime.sessions() as session:
        return await session.get(Recipient, rid)


async def subscription_rows(api: Api, rid: bytes) -> dict[bytes, Subscription]:
    async with api.runtime.sessions() as session:
        rows = await session.execute(select(Subscription).where(Subscription.recipient_id == rid))
        return {row.topic: row for row in rows.scalars()}


# --- seeding (over gRPC) --------------------------------------------------


async def seeded(
    api: Api, topics: int = 2, delivery: dict[str, Any] | None = None
) -> tuple[Creds, list[bytes]]:
    """A registered recipient with `topics` group subscriptions."""
    creds = new_creds()
    await api.stub.Register(register(creds, delivery))
    subscribed = [group_topic() for _ in range(topics)]
    if subscribed:
        await api.stub.UpdateSubscriptions(update(creds, adds_of(*subscribed)))
    return creds, subscribed


async def refused(
    api: Api,
    request: Message,
    code: str,
    message: str,
    transports: tuple[str, ...] = TRANSPORTS,
    **options: Any,
) -> None:
    """Over each transport, the request is answered `code`/`message` and every stored row stays as it was."""
    before = await snapshot(api)
    for transport in transports:
        assert await call(api, transport, request, **options) == Failure(code, message), transport
        assert await snapshot(api) == before, transport


async def accepted(api: Api, request: Message, transports: tuple[str, ...] = TRANSPORTS) -> list[Any]:
    """Send the same request over each transport; every answer must be a success."""
    return [await ok(api, transport, request) for transport in transports]
