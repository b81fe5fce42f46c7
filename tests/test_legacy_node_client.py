"""The legacy API's wire as a client library nobody here wrote speaks it: connect-node, with code
protoc-gen-es generates from our proto (tests/node_client/), calls the five RPCs over Connect JSON,
Connect proto and gRPC, each plain and with gzip requests (docs/legacy.md#routes-and-messages); each
answer and error is as the library hands it over (docs/legacy.md#answers-and-errors), and the calls store
what they say."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support import Api
from tests.support.legacy import group, stored, welcome
from tests.support.node_client import client_report

pytestmark = [pytest.mark.slow, pytest.mark.tools("node", "npm")]

TRANSPORTS = ("json", "proto", "grpc", "json-gzip", "proto-gzip", "grpc-gzip")
EMPTY = {"$typeName": "google.protobuf.Empty"}
KEY = bytes([7] * 32)


@pytest.fixture
async def api(api_with: Callable[..., AbstractAsyncContextManager[Api]]) -> AsyncIterator[Api]:
    async with api_with(
        legacy_api_enabled=True, legacy_http_delivery_url="http://127.0.0.1:9/hook", max_push_topics=3
    ) as started:
        yield started


def registered(answer: dict[str, Any], installation_id: str, since: float, ttl_seconds: int) -> None:
    """A RegisterInstallationResponse: the id as sent, valid_until a bigint of ms one TTL on."""
    assert answer["$typeName"] == "notifications.v1.RegisterInstallationResponse"
    assert answer["installationId"] == installation_id
    valid_until = int(answer["validUntil"]["bigint"])  # a uint64 the library decoded as a bigint
    assert valid_until > time.time() * 1000
    assert since * 1000 + ttl_seconds * 1000 - 1000 <= valid_until <= time.time() * 1000 + ttl_seconds * 1000


async def test_connect_node_calls_every_rpc_over_every_transport(api: Api, tmp_path: Path) -> None:
    since = time.time()
    report = await client_report(
        tmp_path, f"http://127.0.0.1:{api.http_port}", f"http://127.0.0.1:{api.grpc_port}"
    )
    assert sorted(report) == sorted(TRANSPORTS)
    ttl = api.runtime.settings.legacy_installation_ttl_seconds
    for transport, results in report.items():
        methods = [result["method"] for result in results]
        assert methods == [
            "registerInstallation",
            "registerInstallation",
            "subscribe",
            "unsubscribe",
            "subscribeWithMetadata",
            "deleteInstallation",
            "registerInstallation",
            "registerInstallation",
            "subscribe",
            "subscribe",
        ], transport
        answers = [result.get("answer", result.get("error")) for result in results]
        registered(answers[0], f"{transport}-phone", since, ttl)
        registered(answers[1], f"{transport}-hook", since, ttl)
        assert answers[2:6] == [EMPTY] * 4, transport
        assert [result.get("error") for result in results[6:]] == [
            {"code": "InvalidArgument", "message": "missing installation id"},
            {"code": "InvalidArgument", "message": "missing delivery mechanism"},
            {"code": "InvalidArgument", "message": "request is malformed"},
            # 429 over Connect: the library takes the code from the body, as from gRPC's status
            {"code": "ResourceExhausted", "message": "installation topic limit reached"},
        ], transport

    # Sorted here: PostgreSQL's collation may order the ids otherwise.
    rows = await stored(api)
    assert sorted((r[0], r[1], r[2], r[4]) for r in rows["installations"]) == sorted(
        row
        for transport in TRANSPORTS
        for row in (
            (f"{transport}-hook", 3, f"{transport}-token", True),
            (f"{transport}-phone", 1, "a" * 64, False),
        )
    )
    assert sorted(r[:4] for r in rows["subscriptions"]) == sorted(
        row
        for transport in TRANSPORTS
        for row in (
            (f"{transport}-phone", group(1), True, False),
            (f"{transport}-phone", group(2), False, False),
            (f"{transport}-phone", group(3), True, False),  # sent as topic_bytes
            (f"{transport}-phone", welcome(1), True, True),
        )
    )
    assert sorted(rows["keys"]) == sorted((f"{t}-phone", welcome(1), 670, KEY) for t in TRANSPORTS)
