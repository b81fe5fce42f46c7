from __future__ import annotations

import grpc
import pytest

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from tests.support import Api


async def test_register_over_grpc_then_subscribe(api: Api) -> None:
    rid, secret = b"\x11" * 32, b"\x22" * 32
    state = await api.stub.Register(
        pb.RegisterRequest(recipient_id=rid, recipient_secret=secret, fcm=pb.FcmDelivery(token="tok"))
    )
    assert state.topic_count == 0 and state.channel == pb.CHANNEL_FCM
    state = await api.stub.UpdateSubscriptions(
        pb.UpdateSubscriptionsRequest(
            recipient_id=rid, recipient_secret=secret, adds=[pb.Subscription(topic=b"\x00" + b"a" * 16)]
        )
    )
    assert state.topic_count == 1
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await api.stub.Unregister(pb.UnregisterRequest(recipient_id=rid, recipient_secret=b"\x00" * 32))
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert raised.value.details() == "recipient secret is not valid"


async def test_healthz_and_readyz(api: Api) -> None:
    assert (await api.http.get("/healthz")).status_code == 200
    ready = await api.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
