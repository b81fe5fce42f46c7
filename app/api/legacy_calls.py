"""The legacy notifications.v1.Notifications methods, for the Connect and gRPC transports: each
request parsed into a command of app.legacy.commands, one service function, the answer rendered.
Contract: docs/legacy.md#answers-and-errors."""

from __future__ import annotations

from google.protobuf import empty_pb2
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.calls import Method
from app.core import errors
from app.core.growth import Growth
from app.legacy import service
from app.legacy import topics as legacy_topics
from app.legacy.commands import (
    DeleteInstallation,
    Mechanism,
    MechanismKind,
    RegisterInstallation,
    Subscribe,
    SubscriptionSpec,
    Unsubscribe,
)
from app.proto.notifications.v1 import service_pb2 as pb
from app.runtime import Runtime

LEGACY_SERVICE_NAME = "notifications.v1.Notifications"
_MECHANISMS = {
    "apns_device_token": MechanismKind.APNS,
    "firebase_device_token": MechanismKind.FCM,
    "custom_token": MechanismKind.CUSTOM,
}


def mechanism(request: pb.RegisterInstallationRequest) -> Mechanism | None:
    if not request.HasField("delivery_mechanism"):
        return None
    which = request.delivery_mechanism.WhichOneof("delivery_mechanism_type")
    if which is None:
        return None
    return Mechanism(_MECHANISMS[which], getattr(request.delivery_mechanism, which))


def topic_of(text: str, binary: bytes) -> str:
    """A subscription's topic: its binary form wins when given, and names the same subscription as
    its legacy string; a binary topic of another kind or length is malformed."""
    if not binary:
        return text
    converted = legacy_topics.to_string(binary)
    if converted is None:
        raise errors.malformed()
    return converted


def topics_of(texts: list[str], binaries: list[bytes]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*texts, *(topic_of("", b) for b in binaries)]))


def subscription(item: pb.Subscription) -> SubscriptionSpec:
    # A period repeated in one subscription: the last one wins.
    keys = {key.thirty_day_periods_since_epoch: key.key for key in item.hmac_keys}
    return SubscriptionSpec(topic_of(item.topic, item.topic_bytes), item.is_silent, keys)


async def _register(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    assert isinstance(request, pb.RegisterInstallationRequest)
    command = RegisterInstallation(request.installation_id, mechanism(request))
    registered = await service.register(session, runtime.legacy_rules, command, growth)
    return pb.RegisterInstallationResponse(
        installation_id=registered.installation_id, valid_until=registered.valid_until_ms
    )


async def _delete(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    assert isinstance(request, pb.DeleteInstallationRequest)
    await service.delete(session, DeleteInstallation(request.installation_id))
    return empty_pb2.Empty()


async def _subscribe(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    assert isinstance(request, pb.SubscribeRequest)
    installation_id = request.installation_id
    specs = service.topics_only(_topics(installation_id, request))
    await service.subscribe(
        session, runtime.legacy_rules, Subscribe(installation_id, specs, with_metadata=False)
    )
    return empty_pb2.Empty()


async def _subscribe_with_metadata(
    runtime: Runtime, session: AsyncSession, request: Message, growth: Growth
) -> Message:
    assert isinstance(request, pb.SubscribeWithMetadataRequest)
    installation_id = request.installation_id
    service.check_installation_id(installation_id)  # before anything in its list, the contract's order
    specs = tuple(subscription(item) for item in request.subscriptions)
    await service.subscribe(
        session, runtime.legacy_rules, Subscribe(installation_id, specs, with_metadata=True)
    )
    return empty_pb2.Empty()


async def _unsubscribe(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    assert isinstance(request, pb.UnsubscribeRequest)
    await service.unsubscribe(
        session, Unsubscribe(request.installation_id, _topics(request.installation_id, request))
    )
    return empty_pb2.Empty()


def _topics(installation_id: str, request: pb.SubscribeRequest | pb.UnsubscribeRequest) -> tuple[str, ...]:
    service.check_installation_id(installation_id)  # before anything in its list, the contract's order
    return topics_of(list(request.topics), list(request.topics_bytes))


def _topics_asked(request: Message) -> int:
    """A Subscribe's or Unsubscribe's topics, as the topic-changes quota counts them."""
    return len(request.topics) + len(request.topics_bytes)  # type: ignore[attr-defined]


LEGACY_METHODS = {
    m.name: m
    for m in (
        Method(
            "RegisterInstallation",
            pb.RegisterInstallationRequest,
            pb.RegisterInstallationResponse,
            _register,
            LEGACY_SERVICE_NAME,
        ),
        Method(
            "DeleteInstallation", pb.DeleteInstallationRequest, empty_pb2.Empty, _delete, LEGACY_SERVICE_NAME
        ),
        Method(
            "Subscribe",
            pb.SubscribeRequest,
            empty_pb2.Empty,
            _subscribe,
            LEGACY_SERVICE_NAME,
            _topics_asked,
        ),
        Method(
            "SubscribeWithMetadata",
            pb.SubscribeWithMetadataRequest,
            empty_pb2.Empty,
            _subscribe_with_metadata,
            LEGACY_SERVICE_NAME,
            lambda request: len(request.subscriptions),  # type: ignore[attr-defined]
        ),
        Method(
            "Unsubscribe",
            pb.UnsubscribeRequest,
            empty_pb2.Empty,
            _unsubscribe,
            LEGACY_SERVICE_NAME,
            _topics_asked,
        ),
    )
}
