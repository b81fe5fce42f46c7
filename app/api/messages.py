"""Protobuf messages to domain commands and back. No rules here: the service checks everything."""

from __future__ import annotations

from typing import cast

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.recipients.types import (
    Delivery,
    RecipientState,
    RegisterCommand,
    SubscriptionSpec,
    UnregisterCommand,
    UpdateSubscriptionsCommand,
    WireChannel,
)


def register_command(request: pb.RegisterRequest) -> RegisterCommand:
    return RegisterCommand(
        recipient_id=request.recipient_id,
        recipient_secret=request.recipient_secret,
        delivery=_delivery(request),
        metadata=request.metadata,
    )


def _delivery(request: pb.RegisterRequest) -> Delivery | None:
    match request.WhichOneof("delivery"):
        case "apns":
            return Delivery(WireChannel.APNS, request.apns.token)
        case "fcm":
            return Delivery(WireChannel.FCM, request.fcm.token)
        case "http":
            return Delivery(WireChannel.HTTP, request.http.url, request.http.signing_key)
    return None


def unregister_command(request: pb.UnregisterRequest) -> UnregisterCommand:
    return UnregisterCommand(request.recipient_id, request.recipient_secret)


def update_command(request: pb.UpdateSubscriptionsRequest) -> UpdateSubscriptionsCommand:
    return UpdateSubscriptionsCommand(
        recipient_id=request.recipient_id,
        recipient_secret=request.recipient_secret,
        adds=tuple(
            SubscriptionSpec(s.topic, s.hmac_epoch_base, tuple(s.hmac_keys), s.include_commits)
            for s in request.adds
        ),
        removes=tuple(request.removes),
    )


def state_message(state: RecipientState) -> pb.RecipientState:
    return pb.RecipientState(
        topic_count=state.topic_count,
        channel=cast(pb.Channel, int(state.channel)),
        expires_at_ns=state.expires_at_ns,
    )
