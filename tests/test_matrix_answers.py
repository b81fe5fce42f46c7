"""The notify route's answer table over real HTTP: 400 M_NOT_JSON / M_BAD_JSON per field, 413
M_TOO_LARGE (declared or streamed), 404 / 405 M_UNRECOGNIZED, and the route on `xmtp-push api`
(404 M_UNRECOGNIZED when no gateway apps are configured)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fakes.fake_apns import FakeApns
from tests.support import make_settings
from tests.support import running as running_api
from tests.support.matrix import (
    NOTIFY,
    RunningGateway,
    apns_app,
    device,
    event_id_only,
    gateway_settings,
    running,
    write_config,
    write_key_files,
)

APP = "org.example.raw"


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, apns_server: FakeApns) -> str:
    folder = tmp_path_factory.mktemp("answers-config")
    keyfile, _ = write_key_files(folder)
    return write_config(folder, {APP: apns_app(apns_server, keyfile, convert_device_token_to_hex=False)})


@pytest.fixture(scope="module")
async def gateway(config_path: str) -> AsyncIterator[RunningGateway]:
    async with running(gateway_settings(config_path)) as started:
        yield started


def valid() -> dict[str, Any]:
    return event_id_only(device(APP, "ok.answers"))


def with_field(name: str, value: Any) -> dict[str, Any]:
    return {"notification": {**valid(), name: value}}


def with_device_field(name: str, value: Any) -> dict[str, Any]:
    notification = valid()
    notification["devices"] = [{**notification["devices"][0], name: value}]
    return {"notification": notification}


async def post(gateway: RunningGateway, body: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
    response = await gateway.http.post(NOTIFY, content=body, headers=headers)
    return response.status_code, response.json()


@pytest.mark.parametrize("body", [b"", b"\xff\xfe{}", b"{not json", b"[" * 100_000])
async def test_a_body_that_does_not_parse_is_m_not_json(gateway: RunningGateway, body: bytes) -> None:
    status, error = await post(gateway, body)
    assert (status, error["errcode"]) == (400, "M_NOT_JSON")


BAD_SHAPES: list[tuple[str, Any]] = [
    ("top level is an array", []),
    ("no notification", {}),
    ("notification not an object", {"notification": "x"}),
    ("no devices", {"notification": {"event_id": "$e"}}),
    ("empty devices", with_field("devices", [])),
    ("devices not an array", with_field("devices", {"app_id": APP})),
    ("device not an object", with_field("devices", ["x"])),
    ("device without app_id", {"notification": {"devices": [{"pushkey": "k"}]}}),
    ("device without pushkey", {"notification": {"devices": [{"app_id": APP}]}}),
    ("app_id not a string", with_device_field("app_id", 1)),
    ("pushkey not a string", with_device_field("pushkey", ["k"])),
    ("pushkey_ts not an integer", with_device_field("pushkey_ts", "1")),
    ("pushkey_ts a boolean", with_device_field("pushkey_ts", True)),
    ("data not an object", with_device_field("data", "x")),
    ("tweaks not an object", with_device_field("tweaks", [])),
    ("event_id not a string", with_field("event_id", 1)),
    ("event_id null", with_field("event_id", None)),
    ("room_id not a string", with_field("room_id", {})),
    ("type not a string", with_field("type", 3)),
    ("sender not a string", with_field("sender", False)),
    ("sender_display_name not a string", with_field("sender_display_name", 1)),
    ("room_name not a string", with_field("room_name", [])),
    ("room_alias not a string", with_field("room_alias", 1)),
    ("user_is_target not a boolean", with_field("user_is_target", "true")),
    ("prio not high or low", with_field("prio", "urgent")),
    ("prio not a string", with_field("prio", 10)),
    ("content not an object", with_field("content", "hello")),
    ("counts not an object", with_field("counts", 3)),
    ("unread not an integer", with_field("counts", {"unread": "3"})),
    ("missed_calls not an integer", with_field("counts", {"missed_calls": 1.5})),
    ("unread a boolean", with_field("counts", {"unread": True})),
]


@pytest.mark.parametrize(("case", "document"), BAD_SHAPES, ids=[case for case, _ in BAD_SHAPES])
async def test_a_body_of_the_wrong_shape_is_m_bad_json(
    gateway: RunningGateway, case: str, document: Any
) -> None:
    status, error = await post(gateway, json.dumps(document).encode())
    assert (status, error["errcode"]) == (400, "M_BAD_JSON"), case
    assert "ok.answers" not in error["error"]  # names the field, never a value


async def test_null_type_and_sender_and_absent_fields_are_accepted(gateway: RunningGateway) -> None:
    notification = {
        "type": None,
        "sender": None,
        "counts": {"unread": 1},
        "devices": [device(APP, "ok.null")],
    }
    status, answer = await post(gateway, json.dumps({"notification": notification}).encode())
    assert (status, answer) == (200, {"rejected": []})


async def test_a_body_declared_over_512_kib_is_m_too_large(gateway: RunningGateway) -> None:
    body = json.dumps(with_field("content", {"body": "x" * 600_000})).encode()
    status, error = await post(gateway, body)
    assert (status, error["errcode"]) == (413, "M_TOO_LARGE")


async def test_a_body_streamed_past_512_kib_is_m_too_large(gateway: RunningGateway) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b" " * 8192  # 800 KiB in all, no Content-Length

    response = await gateway.http.post(NOTIFY, content=chunks())
    assert (response.status_code, response.json()["errcode"]) == (413, "M_TOO_LARGE")


@pytest.mark.slow
async def test_a_body_that_trickles_is_answered_408_at_the_request_timeout(config_path: str) -> None:
    # The body's time counts against the request's one deadline (XMTP_PUSH_MATRIX_REQUEST_TIMEOUT_SECONDS).
    async with running(gateway_settings(config_path, matrix_request_timeout_seconds=1.0)) as slow:
        body = json.dumps(valid()).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", slow.port)
        head = f"POST {NOTIFY} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode())
        started = asyncio.get_running_loop().time()
        answer = asyncio.ensure_future(reader.read(4096))
        for byte in body[:30]:  # a byte every 0.1 s: the whole would take several seconds
            if answer.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
        response = await asyncio.wait_for(answer, 5)
        elapsed = asyncio.get_running_loop().time() - started
        writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line.split()[1] == b"408"
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["errcode"] == "M_UNKNOWN"
    assert 1.0 <= elapsed < 2.0


async def test_exactly_512_kib_is_taken(gateway: RunningGateway) -> None:
    body = json.dumps({"notification": valid()}).encode()
    body += b" " * (512 * 1024 - len(body))
    status, answer = await post(gateway, body)
    assert (status, answer) == (200, {"rejected": []})


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_another_method_on_notify_is_405_m_unrecognized(gateway: RunningGateway, method: str) -> None:
    response = await gateway.http.request(method, NOTIFY)
    assert (response.status_code, response.json()["errcode"]) == (405, "M_UNRECOGNIZED")
    assert response.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "path", ["/_matrix/push/v1/other", "/_matrix/push/v2/notify", "/_matrix/client/versions"]
)
async def test_an_unknown_matrix_path_is_404_m_unrecognized(gateway: RunningGateway, path: str) -> None:
    response = await gateway.http.post(path, json={})
    assert (response.status_code, response.json()["errcode"]) == (404, "M_UNRECOGNIZED")


async def test_the_gateway_process_serves_no_xmtp_routes(gateway: RunningGateway) -> None:
    response = await gateway.http.post("/xmtp.backend.v1.NotificationService/Register", json={})
    assert response.status_code == 404


async def test_api_without_matrix_apps_answers_404_m_unrecognized(sqlite_url: str) -> None:
    async with running_api(make_settings(sqlite_url), clear=False) as api:
        response = await api.http.post(NOTIFY, json={"notification": valid()})
        health = await api.http.get("/health")
    assert (response.status_code, response.json()["errcode"]) == (404, "M_UNRECOGNIZED")
    assert (health.status_code, health.content) == (200, b"")  # Sygnal's probe, as on every HTTP app


async def test_api_with_matrix_apps_serves_notify(
    sqlite_url: str, config_path: str, apns_server: FakeApns
) -> None:
    apns_server.reset()
    settings = make_settings(sqlite_url, matrix_apps=config_path)
    async with running_api(settings, clear=False, gateway=True) as api:
        response = await api.http.post(NOTIFY, json={"notification": event_id_only(device(APP, "gone.api"))})
        health = await api.http.get("/health")
    assert (response.status_code, response.json()) == (200, {"rejected": ["gone.api"]})
    assert (health.status_code, health.content) == (200, b"")


async def test_api_says_the_http_section_is_not_its_address(
    sqlite_url: str, tmp_path: Path, apns_server: FakeApns, caplog: pytest.LogCaptureFixture
) -> None:
    keyfile, _ = write_key_files(tmp_path)
    apps = {APP: apns_app(apns_server, keyfile, convert_device_token_to_hex=False)}
    path = write_config(tmp_path, apps, http={"bind_addresses": ["0.0.0.0"], "port": 5000})
    with caplog.at_level(logging.WARNING, logger="app.runtime"):
        async with running_api(make_settings(sqlite_url, matrix_apps=path), clear=False, gateway=True) as api:
            assert (await api.http.get("/health")).status_code == 200
    assert [r.getMessage() for r in caplog.records if r.name == "app.runtime"] == [
        "XMTP_PUSH_MATRIX_APPS: its http section is read by `xmtp-push gateway` only; this process "
        "listens on XMTP_PUSH_HTTP_HOST and XMTP_PUSH_HTTP_PORT"
    ]
