"""What caller authentication covers (docs/callers.md#what-is-covered): NotificationService by its
name on both ports, decided before the body; health and the other routes keep their own rules; off,
nothing changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.proto.notifications.v1 import service_pb2 as lpb
from tests.support import Api, make_settings, running
from tests.support.auth import API_KEY
from tests.support.auth_calls import connect_call, grpc_call
from tests.support.legacy import Refused, legacy_call

BEARER = [f"Bearer {API_KEY}"]
UNKNOWN = "/xmtp.backend.v1.NotificationService/NoSuchMethod"
LEGACY = "/notifications.v1.Notifications/Subscribe"


@pytest.fixture(scope="module")
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    settings = make_settings(
        sqlite_url, auth_enabled=True, auth_api_keys={"worker": API_KEY}, ingest_token="i" * 40
    )
    async with running(settings) as started:
        yield started


async def test_grpc_health_stays_open(api: Api) -> None:
    reply = await health_pb2_grpc.HealthStub(api.grpc_channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"])
async def test_the_operations_routes_stay_open(api: Api, path: str) -> None:
    assert (await api.http.get(path)).status_code == 200


async def test_an_unknown_method_is_unauthenticated_before_unimplemented(api: Api) -> None:
    assert (await grpc_call(api, [], UNKNOWN)).code == "UNAUTHENTICATED"
    assert (await grpc_call(api, BEARER, UNKNOWN)).code == "UNIMPLEMENTED"
    assert (await connect_call(api, [], UNKNOWN)).status == 401
    assert (await connect_call(api, BEARER, UNKNOWN)).status == 404


@pytest.mark.parametrize("verb", ["GET", "PUT", "DELETE", "OPTIONS"])
async def test_any_verb_on_a_connect_path_needs_a_credential(api: Api, verb: str) -> None:
    response = await api.http.request(verb, "/xmtp.backend.v1.NotificationService/Register")
    assert (response.status_code, response.json()["code"]) == (401, "unauthenticated")


async def test_the_content_type_and_timeout_are_checked_after_the_credential(api: Api) -> None:
    answer = await connect_call(api, [], content_type="text/plain")
    assert (answer.status, answer.message) == (401, "missing bearer token")
    assert (await connect_call(api, BEARER, content_type="text/plain")).status == 415


async def test_a_body_over_the_bound_without_a_credential_is_unauthenticated(api: Api) -> None:
    response = await api.http.post(
        "/xmtp.backend.v1.NotificationService/Register",
        content=b"x" * (5 * 1024 * 1024),
        headers={"content-type": "application/proto"},
    )
    assert (response.status_code, response.json()["code"]) == (401, "unauthenticated")


async def test_a_grpc_message_that_never_arrives_is_refused_at_once(api: Api) -> None:
    async def never() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    call = api.grpc_channel.stream_unary("/xmtp.backend.v1.NotificationService/Register")(never(), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_legacy_api_is_not_covered(api: Api) -> None:
    assert (await grpc_call(api, [], LEGACY)).code != "UNAUTHENTICATED"
    assert (await connect_call(api, [], LEGACY)).status != 401


async def test_the_legacy_api_served_beside_it_answers_without_a_credential(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(
        sqlite_url, auth_enabled=True, auth_api_keys={"worker": API_KEY}, legacy_api_enabled=True
    )
    async with running(settings) as api:
        for transport in ("grpc", "json", "proto"):
            reply = await legacy_call(api, transport, lpb.SubscribeRequest(installation_id="i", topics=[]))
            assert not isinstance(reply, Refused), (transport, reply)
        assert (
            await grpc_call(api, [], "/xmtp.backend.v1.NotificationService/Register")
        ).code == "UNAUTHENTICATED"
    warned = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "legacy" in r.getMessage()
    ]
    assert warned == [
        "XMTP_PUSH_AUTH_ENABLED does not cover the legacy notifications.v1 API "
        "(XMTP_PUSH_LEGACY_API_ENABLED): its callers send no credentials"
    ]


async def test_ingest_wants_its_token_and_no_api_key(api: Api) -> None:
    response = await api.http.post("/v1/envelopes", content=b"{}", headers={"authorization": BEARER[0]})
    assert response.status_code == 401
    ingest = await api.http.post(
        "/v1/envelopes", content=b"{}", headers={"authorization": f"Bearer {'i' * 40}"}
    )
    assert ingest.status_code != 401


async def test_off_nothing_is_asked(sqlite_url: str) -> None:
    async with running(make_settings(sqlite_url)) as plain:
        assert (await grpc_call(plain, [], UNKNOWN)).code == "UNIMPLEMENTED"
        assert (await grpc_call(plain, ["Basic nonsense"])).code == "INVALID_ARGUMENT"
        assert (await connect_call(plain, [], content_type="text/plain")).status == 415
