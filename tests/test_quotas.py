"""Quotas per caller (docs/callers.md#quotas-per-caller), each rule over gRPC and Connect: a call over
a quota is answered UNAVAILABLE `too many requests; retry later` (Connect 503 with Retry-After),
changes nothing, and counts in xmtp_push_throttled_total{quota}; the caller is the principal, else the
address (forwarded only by a trusted proxy); the legacy API's calls count with the new API's."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from app.proto.notifications.v1 import service_pb2 as lpb
from tests.support import Api, make_settings, running
from tests.support.auth import API_KEY
from tests.support.builders import adds_of, group_topic, new_creds, recipient_row, register, update
from tests.support.legacy import group, register_request, stored
from tests.support.quotas import LEGACY, NOTIFICATIONS, TRANSPORTS, Answer, send

REGISTER = NOTIFICATIONS + "Register"
UPDATE = NOTIFICATIONS + "UpdateSubscriptions"
CALLS, TOPIC_CHANGES = 5, 10
_addresses = itertools.count(1)


def new_caller() -> dict[str, str]:
    """Headers of a caller of its own, forwarded by the (trusted) loopback proxy."""
    n = next(_addresses)
    return {"x-forwarded-for": f"198.51.{n // 250}.{n % 250 + 1}"}


def throttled(quota: str) -> float:
    return REGISTRY.get_sample_value("xmtp_push_throttled_total", {"quota": quota}) or 0.0


@pytest.fixture(scope="module")
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    settings = make_settings(
        sqlite_url,
        caller_calls_per_minute=CALLS,
        caller_topic_changes_per_minute=TOPIC_CHANGES,
        trusted_proxies="127.0.0.0/8",
        legacy_api_enabled=True,
    )
    async with running(settings) as started:
        yield started


def assert_throttled(answer: Answer, transport: str) -> None:
    assert answer.throttled, answer
    if transport == "connect":
        assert answer.status == 503
        assert answer.retry_after is not None and answer.retry_after.isdigit(), answer
        assert int(answer.retry_after) >= 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_calls_over_the_quota_are_unavailable_and_change_nothing(
    api: Api, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caller, before = new_caller(), throttled("calls")
    for _ in range(CALLS):
        assert (await send(api, transport, REGISTER, register(new_creds()), caller)).code == "ok"
    creds = new_creds()
    with caplog.at_level(logging.INFO):
        answer = await send(api, transport, REGISTER, register(creds), caller)
    # Not a line per refused call: the quota's own lines say when throttling starts and stops.
    assert not [r for r in caplog.records if "too many requests" in r.getMessage()]
    assert_throttled(answer, transport)
    if transport == "connect":  # a token comes back every 60 / CALLS seconds
        assert int(answer.retry_after or 0) <= 60 // CALLS
    assert await recipient_row(api, creds.rid) is None
    assert throttled("calls") == before + 1
    # Another caller is not held back; nothing of either caller is logged.
    assert (await send(api, transport, REGISTER, register(new_creds()), new_caller())).code == "ok"
    for record in caplog.records:
        assert "198.51." not in record.getMessage()


async def test_both_apis_and_both_transports_count_as_one_callers_calls(api: Api) -> None:
    caller = new_caller()
    calls = [
        ("grpc", REGISTER, register(new_creds())),
        ("connect", LEGACY + "RegisterInstallation", register_request("install-quota-1")),
        ("grpc", LEGACY + "Subscribe", lpb.SubscribeRequest(installation_id="install-quota-1")),
        ("connect", REGISTER, register(new_creds())),
        ("grpc", LEGACY + "DeleteInstallation", lpb.DeleteInstallationRequest(installation_id="x-1")),
    ]
    for transport, path, request in calls:
        assert (await send(api, transport, path, request, caller)).code == "ok", path
    assert_throttled(await send(api, "connect", REGISTER, register(new_creds()), caller), "connect")
    legacy = lpb.SubscribeRequest(installation_id="install-quota-1", topics=[group(1)])
    assert_throttled(await send(api, "grpc", LEGACY + "Subscribe", legacy, caller), "grpc")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_topic_changes_over_the_quota_are_refused_whole(api: Api, transport: str) -> None:
    caller, creds, before = new_caller(), new_creds(), throttled("topic_changes")
    assert (await send(api, transport, REGISTER, register(creds), caller)).code == "ok"
    first = [group_topic() for _ in range(6)]
    assert (await send(api, transport, UPDATE, update(creds, adds_of(*first)), caller)).code == "ok"
    # 6 taken, 4 left: 3 adds and 2 removes are 5 changes, one too many.
    request = update(creds, adds_of(*(group_topic() for _ in range(3))), removes=first[:2])
    assert_throttled(await send(api, transport, UPDATE, request, caller), transport)
    assert (await recipient_row(api, creds.rid)).topic_count == 6  # type: ignore[union-attr]
    assert throttled("topic_changes") == before + 1
    # More changes than the bucket holds can never pass: refused whole, a full minute said.
    other, big = new_caller(), new_creds()
    assert (await send(api, transport, REGISTER, register(big), other)).code == "ok"
    too_many = update(big, adds_of(*(group_topic() for _ in range(TOPIC_CHANGES + 1))))
    answer = await send(api, transport, UPDATE, too_many, other)
    assert_throttled(answer, transport)
    assert answer.retry_after in (None, "60")
    assert (await recipient_row(api, big.rid)).topic_count == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_legacy_apis_subscriptions_count_as_topic_changes(api: Api, transport: str) -> None:
    caller, installation = new_caller(), f"install-topics-{transport}"
    path = LEGACY + "RegisterInstallation"
    assert (await send(api, transport, path, register_request(installation), caller)).code == "ok"
    subscribe = lpb.SubscribeRequest(installation_id=installation, topics=[group(n) for n in range(8)])
    assert (await send(api, transport, LEGACY + "Subscribe", subscribe, caller)).code == "ok"
    before = await stored(api)
    unsubscribe = lpb.UnsubscribeRequest(installation_id=installation, topics=[group(n) for n in range(3)])
    assert_throttled(await send(api, transport, LEGACY + "Unsubscribe", unsubscribe, caller), transport)
    assert await stored(api) == before


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_trusted_proxy_names_the_rightmost_untrusted_address(api: Api, transport: str) -> None:
    # What a caller writes itself is left of what the proxies append: it cannot choose its bucket.
    caller = new_caller()["x-forwarded-for"]
    for n in range(CALLS):
        headers = {"x-forwarded-for": f"192.0.2.{n}, {caller}, 127.0.0.9"}
        assert (await send(api, transport, REGISTER, register(new_creds()), headers)).code == "ok"
    headers = {"x-forwarded-for": f"192.0.2.99, {caller}"}
    assert_throttled(await send(api, transport, REGISTER, register(new_creds()), headers), transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_forwarding_headers_of_an_untrusted_peer_are_not_read(sqlite_url: str, transport: str) -> None:
    settings = make_settings(sqlite_url, caller_calls_per_minute=2)
    async with running(settings) as api:
        for n in range(2):
            headers = {"x-forwarded-for": f"203.0.113.{n}"}
            assert (await send(api, transport, REGISTER, register(new_creds()), headers)).code == "ok"
        headers = {"x-forwarded-for": "203.0.113.77"}
        assert_throttled(await send(api, transport, REGISTER, register(new_creds()), headers), transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_with_auth_on_the_principal_is_the_caller(sqlite_url: str, transport: str) -> None:
    other_key = "o" * 40
    settings = make_settings(
        sqlite_url,
        caller_calls_per_minute=2,
        auth_enabled=True,
        auth_api_keys={"first": API_KEY, "second": other_key},
    )
    first, second = {"authorization": f"Bearer {API_KEY}"}, {"authorization": f"Bearer {other_key}"}
    async with running(settings) as api:
        for _ in range(2):
            assert (await send(api, transport, REGISTER, register(new_creds()), first)).code == "ok"
        assert_throttled(await send(api, transport, REGISTER, register(new_creds()), first), transport)
        # The same address, another principal: a bucket of its own.
        assert (await send(api, transport, REGISTER, register(new_creds()), second)).code == "ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_new_recipients_are_bounded_for_all_callers_together(sqlite_url: str, transport: str) -> None:
    settings = make_settings(sqlite_url, new_recipients_per_minute=2, legacy_api_enabled=True)
    async with running(settings) as api:
        before = throttled("new_recipients")
        kept = new_creds()
        assert (await send(api, transport, REGISTER, register(kept), new_caller())).code == "ok"
        assert (await send(api, transport, REGISTER, register(new_creds()), new_caller())).code == "ok"
        creds = new_creds()
        assert_throttled(await send(api, transport, REGISTER, register(creds), new_caller()), transport)
        assert await recipient_row(api, creds.rid) is None
        path = LEGACY + "RegisterInstallation"
        assert_throttled(await send(api, transport, path, register_request("install-new"), {}), transport)
        assert (await stored(api))["installations"] == []
        assert throttled("new_recipients") == before + 2
        # Registering again what exists creates nothing: it passes.
        assert (await send(api, transport, REGISTER, register(kept))).code == "ok"
