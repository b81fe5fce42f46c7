"""One app's trouble stays its own: a provider that never answers, an in-flight limit reached, and the
duplicate memory shared through Redis by two gateway processes. Real HTTP and the local APNs fakes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from fakes.fake_apns import FakeApns
from fakes.tls import TlsFiles
from tests.support.matrix import (
    RunningGateway,
    apns_app,
    device,
    event_id_only,
    gateway_settings,
    running,
    write_config,
    write_key_files,
)
from tests.support.pipeline import redis_url  # noqa: F401  (the test Redis DB, flushed)

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

HUNG, LIMITED, LIVE = "org.example.hung", "org.example.limited", "org.example.live"
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def hung_apns(tls: TlsFiles) -> Iterator[FakeApns]:
    """An APNs that takes requests and never answers."""
    with FakeApns(tls) as fake:
        fake.answering = False
        yield fake


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, apns_server: FakeApns, hung_apns: FakeApns) -> str:
    folder = tmp_path_factory.mktemp("isolation-config")
    keyfile, _ = write_key_files(folder)
    raw = {"convert_device_token_to_hex": False}
    apps = {
        HUNG: apns_app(hung_apns, keyfile, **raw),
        LIMITED: apns_app(hung_apns, keyfile, inflight_request_limit=2, **raw),
        LIVE: apns_app(apns_server, keyfile, **raw),
    }
    return write_config(folder, apps)


@pytest.fixture(scope="module")
async def gateway(config_path: str) -> AsyncIterator[RunningGateway]:
    async with running(gateway_settings(config_path, matrix_request_timeout_seconds=TIMEOUT)) as started:
        yield started


def notification(app_id: str, name: str = "ok") -> dict[str, object]:
    return event_id_only(device(app_id, f"{name}.{uuid.uuid4().hex[:8]}"), event_id=f"${uuid.uuid4().hex}")


def devices_counted(app: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("xmtp_push_matrix_devices_total", {"app": app, "outcome": outcome})
    return value or 0.0


async def test_a_hung_app_never_slows_another(gateway: RunningGateway, apns_server: FakeApns) -> None:
    # The live app's first push makes its connection and token: a first send's set-up, not a wait.
    assert (await gateway.notify(notification(LIVE))).status_code == 200
    hung = [asyncio.create_task(gateway.notify(notification(HUNG))) for _ in range(20)]
    await asyncio.sleep(0.2)  # the hung app's requests are all in flight
    slowest = 0.0
    for _ in range(20):
        started = time.monotonic()
        response = await gateway.notify(notification(LIVE))
        slowest = max(slowest, time.monotonic() - started)
        assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert slowest < TIMEOUT / 2, slowest  # waiting behind the hung app would take its 2 s
    assert not any(task.done() for task in hung)
    started = time.monotonic()
    answers = await asyncio.gather(*hung)
    assert {answer.status_code for answer in answers} == {502}
    assert time.monotonic() - started < TIMEOUT + 1.0  # answered at the timeout, not later


async def test_past_the_in_flight_limit_the_answer_is_502_at_once(gateway: RunningGateway) -> None:
    limited_before = devices_counted(LIMITED, "limited")
    waiting = [asyncio.create_task(gateway.notify(notification(LIMITED))) for _ in range(2)]
    await asyncio.sleep(0.2)
    started = time.monotonic()
    response = await gateway.notify(notification(LIMITED))
    assert response.status_code == 502
    assert time.monotonic() - started < TIMEOUT / 2  # at once, not after the 2 s timeout
    assert devices_counted(LIMITED, "limited") == limited_before + 1
    assert {answer.status_code for answer in await asyncio.gather(*waiting)} == {502}
    # With its slots free again, the app takes requests again (and they fail on the hung fake).
    assert devices_counted(LIMITED, "failed") >= 2


async def test_logs_name_no_pushkey_event_or_room(
    gateway: RunningGateway, apns_server: FakeApns, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_key, secret_event = "gone.secretkey", "$secret-event"
    body = event_id_only(
        device(LIVE, secret_key), device("org.unknown", "secret-unknown"), event_id=secret_event
    )
    response = await gateway.notify(body)
    assert response.json() == {"rejected": [secret_key, "secret-unknown"]}
    await gateway.notify(notification(HUNG))
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "rejected" in text and "no answer" in text  # something was logged
    for value in (secret_key, secret_event, "secret-unknown", "!room:example.org"):
        assert value not in text


async def test_duplicates_are_shared_through_redis(
    config_path: str,
    apns_server: FakeApns,
    redis_url: str,
) -> None:
    apns_server.reset()
    settings = gateway_settings(config_path, redis_url=redis_url)
    body = notification(LIVE)
    async with running(settings) as first, running(settings) as second:
        for gateway in (first, second, first):
            response = await gateway.notify(body)
            assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert len(apns_server.requests) == 1
    client = Redis.from_url(redis_url)
    try:
        keys = [key.decode() for key in await client.keys("*")]
        ttl = await client.ttl(keys[0])
    finally:
        await client.aclose()
    assert len(keys) == 1 and keys[0].startswith("xmtp-push:matrix:delivered:")
    pushkey = body["devices"][0]["pushkey"]  # type: ignore[index]
    assert pushkey not in keys[0] and str(body["event_id"]) not in keys[0]
    assert 590 <= ttl <= 600


async def test_redis_down_sends_rather_than_fails(config_path: str, apns_server: FakeApns) -> None:
    apns_server.reset()
    settings = gateway_settings(config_path, redis_url="redis://127.0.0.1:9/0")  # nothing listens there
    body = notification(LIVE)
    async with running(settings) as gateway:
        for _ in range(2):
            response = await gateway.notify(body)
            assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert len(apns_server.requests) == 2  # no memory to share: sent each time, never refused


async def test_the_timeout_counts_from_the_requests_arrival(gateway: RunningGateway) -> None:
    body = json.dumps({"notification": notification(HUNG)}).encode()

    async def slowly() -> AsyncIterator[bytes]:
        for index in range(0, len(body), len(body) // 4 + 1):  # the body takes over a second to arrive
            yield body[index : index + len(body) // 4 + 1]
            await asyncio.sleep(0.3)

    started = time.monotonic()
    response = await gateway.http.post("/_matrix/push/v1/notify", content=slowly())
    elapsed = time.monotonic() - started
    assert response.status_code == 502
    # The body's time and the sending's share one timeout (counted apart, it would be 3.2 s or more).
    assert 1.2 < elapsed < TIMEOUT + 1.0, elapsed
