"""`xmtp-push gateway` as the operator runs it: the console script in a child process, its answers and
its log lines, against the local APNs and FCM fakes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.ops.healthcheck import Verdict, check
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm, Reply
from tests.support.matrix import (
    PROJECT,
    SERVING,
    GatewayProcess,
    apns_app,
    b64,
    device,
    event_id_only,
    gateway_process,
    gcm_app,
    write_config,
    write_key_files,
)
from tests.support.ops import free_port

# Each test runs `xmtp-push gateway` as its own process: a second or more.
pytestmark = pytest.mark.slow

NO_BADGE_IOS, NO_BADGE_ANDROID = "org.nobadge.ios", "org.nobadge.android"
# Two gcm apps of one service-account file: its own project, and another.
OWN_PROJECT, OTHER_PROJECT = "org.project.own", "org.project.other"
# Apps whose pushes fail, each for its cause (and the cause logged for it).
CAUSES = {
    "org.fail.refused": "connection refused",
    "org.fail.dns": "DNS: the host name does not resolve",
    "org.fail.tls": "TLS handshake failed (is the certificate trusted?)",
    "org.fail.apns": "credentials refused (HTTP 403 InvalidProviderToken)",
    "org.fail.fcm": "HTTP 429 QUOTA_EXCEEDED",
    "org.fail.slow": "no answer within the request's time (XMTP_PUSH_MATRIX_REQUEST_TIMEOUT_SECONDS)",
}
# The pushkey each app's device sends (the fakes answer by its name).
PUSHKEYS = {"org.fail.apns": "forbidden.k3y", "org.fail.fcm": "quota.k3y", "org.fail.slow": "slow.k3y"}
LOCAL = {
    "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
    "XMTP_PUSH_HTTP_PORT": "0",
    "XMTP_PUSH_MATRIX_REQUEST_TIMEOUT_SECONDS": "4",
}


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, apns_server: FakeApns, fcm_server: FakeFcm) -> str:
    folder = tmp_path_factory.mktemp("matrix-process")
    keyfile, account = write_key_files(folder, fcm_server)
    apps = {
        NO_BADGE_IOS: apns_app(
            apns_server, keyfile, convert_device_token_to_hex=False, send_badge_counts=False
        ),
        NO_BADGE_ANDROID: gcm_app(fcm_server, account, send_badge_counts=False),
        OWN_PROJECT: gcm_app(fcm_server, account),
        OTHER_PROJECT: gcm_app(fcm_server, account, project_id="other-project"),
        "org.fail.refused": apns_app(apns_server, keyfile, endpoint=f"https://127.0.0.1:{free_port()}"),
        "org.fail.dns": apns_app(apns_server, keyfile, endpoint="https://gateway-test.invalid"),
        "org.fail.tls": apns_app(apns_server, keyfile, ca_file=None),  # the fake's certificate: not trusted
        "org.fail.apns": apns_app(apns_server, keyfile, convert_device_token_to_hex=False),
        "org.fail.fcm": gcm_app(fcm_server, account),
        "org.fail.slow": gcm_app(fcm_server, account),
    }
    return write_config(folder, apps)


@pytest.fixture(scope="module")
async def gateway(config_path: str) -> AsyncIterator[GatewayProcess]:
    async with gateway_process(config_path, **LOCAL) as started:
        yield started


async def test_send_badge_counts_false_sends_no_badge_only_update_and_is_no_unknown_key(
    gateway: GatewayProcess, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    devices = [device(NO_BADGE_IOS, "ok.ios"), device(NO_BADGE_ANDROID, "ok.android")]
    badge_only = {"id": "", "type": None, "sender": "", "counts": {"unread": 4}, "devices": devices}
    response = await gateway.notify(badge_only)
    assert (response.status_code, response.json()) == (200, {"rejected": []})
    assert (apns.requests, fcm.requests) == ([], [])
    warnings = [r["event"] for r in gateway.records() if r.get("level") == "warning"]
    assert not any("unknown keys" in warning for warning in warnings), warnings


async def test_two_gcm_apps_of_one_service_account_push_to_their_own_projects(
    gateway: GatewayProcess, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    _, fcm = fakes
    fcm.projects = {PROJECT}  # FCM refuses the account for the other project
    own = await gateway.notify(event_id_only(device(OWN_PROJECT, "ok.own")))
    assert (own.status_code, own.json()) == (200, {"rejected": []})
    other = await gateway.notify(event_id_only(device(OTHER_PROJECT, "ok.other")))
    assert other.status_code == 502  # not the token's fault: the homeserver keeps the pusher
    assert {r.token: r.path for r in fcm.requests} == {
        "ok.own": f"/v1/projects/{PROJECT}/messages:send",
        "ok.other": "/v1/projects/other-project/messages:send",
    }


async def test_get_health_answers_200_with_an_empty_body_as_sygnal(gateway: GatewayProcess) -> None:
    response = await gateway.http.get("/health")
    assert (response.status_code, response.content) == (200, b"")


def failing(app_id: str) -> dict[str, object]:
    return device(app_id, PUSHKEYS.get(app_id) or b64(bytes(32)))


def warnings_of(gateway: GatewayProcess, app_id: str) -> list[str]:
    prefix = f"matrix app {app_id}: "
    return [
        r["event"] for r in gateway.records() if r.get("level") == "warning" and r["event"].startswith(prefix)
    ]


@pytest.mark.parametrize("app_id", list(CAUSES))
async def test_a_failed_push_names_its_cause_at_warning_and_never_the_pushkey(
    gateway: GatewayProcess, fakes: tuple[FakeApns, FakeFcm], app_id: str
) -> None:
    response = await gateway.notify(event_id_only(failing(app_id)))
    assert response.status_code == 502
    await gateway.child.line(re.compile(re.escape(f"matrix app {app_id}: pushes fail: ")), timeout=10)
    [warning] = warnings_of(gateway, app_id)
    assert warning == f"matrix app {app_id}: pushes fail: {CAUSES[app_id]}"
    pushkey = str(failing(app_id)["pushkey"])
    assert not any(pushkey in line or "k3y" in line for line in gateway.child.lines)


async def test_a_cause_is_said_once_per_change_and_recovery_once(
    gateway: GatewayProcess, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    _, fcm = fakes
    app_id = OWN_PROJECT
    fcm.script(
        "flip",
        Reply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
        Reply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
        Reply(200),
        Reply(403, "PERMISSION_DENIED"),
    )
    notifications = [
        event_id_only(device(app_id, "flip.1"), event_id=f"$flip{n}:example.org") for n in range(4)
    ]
    answers = [(await gateway.notify(notification)).status_code for notification in notifications]
    assert answers == [502, 502, 200, 502]
    await gateway.child.line(
        re.compile(re.escape(f"matrix app {app_id}: pushes fail: credentials")), timeout=10
    )
    events = [r["event"] for r in gateway.records() if r["event"].startswith(f"matrix app {app_id}: ")]
    assert events == [
        f"matrix app {app_id}: pushes fail: HTTP 429 QUOTA_EXCEEDED",
        f"matrix app {app_id}: pushes go through again",
        f"matrix app {app_id}: pushes fail: credentials refused (HTTP 403 PERMISSION_DENIED)",
    ]


def http_config(folder: Path, apns: FakeApns, port: int) -> str:
    keyfile, _ = write_key_files(folder)
    http = {"bind_addresses": ["127.0.0.1", "::1"], "port": port}
    return write_config(folder, {NO_BADGE_IOS: apns_app(apns, keyfile)}, http=http)


async def test_the_gateway_listens_where_its_sygnal_yaml_says(tmp_path: Path, apns_server: FakeApns) -> None:
    port = free_port()
    path = http_config(tmp_path, apns_server, port)
    async with gateway_process(path) as gateway:
        chosen = "(http.bind_addresses of XMTP_PUSH_MATRIX_APPS, http.port of XMTP_PUSH_MATRIX_APPS)"
        line = json.loads((await gateway.child.line(SERVING)).string)["event"]
        assert line == f"serving the Matrix push gateway on 127.0.0.1:{port}, [::1]:{port} {chosen}"
        async with httpx.AsyncClient(timeout=10) as client:
            for host in ("127.0.0.1", "[::1]"):
                response = await client.get(f"http://{host}:{port}/health")
                assert response.status_code == 200, host
        settings = Settings(database_url="sqlite+aiosqlite:///unused.db", matrix_apps=path)
        verdict = await asyncio.to_thread(check, settings, "gateway")
        assert verdict == Verdict(
            True, f"ok: `gateway` on http.port of XMTP_PUSH_MATRIX_APPS ({port}) is ready"
        )


async def test_an_explicit_http_setting_wins_over_the_sygnal_yaml(
    tmp_path: Path, apns_server: FakeApns
) -> None:
    yaml_port, port = free_port(), free_port()
    path = http_config(tmp_path, apns_server, yaml_port)
    async with gateway_process(path, XMTP_PUSH_HTTP_PORT=str(port)) as gateway:
        line = json.loads((await gateway.child.line(SERVING)).string)["event"]
        chosen = "(http.bind_addresses of XMTP_PUSH_MATRIX_APPS, XMTP_PUSH_HTTP_PORT)"
        assert line == f"serving the Matrix push gateway on 127.0.0.1:{port}, [::1]:{port} {chosen}"
        assert (await gateway.http.get("/health")).status_code == 200
        with pytest.raises(httpx.ConnectError):
            await gateway.http.get(f"http://127.0.0.1:{yaml_port}/health")
