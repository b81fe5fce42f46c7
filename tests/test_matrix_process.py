"""`xmtp-push gateway` as the operator runs it: the console script in a child process, its answers and
its log lines, against the local APNs and FCM fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support.matrix import (
    PROJECT,
    GatewayProcess,
    apns_app,
    device,
    event_id_only,
    gateway_process,
    gcm_app,
    write_config,
    write_key_files,
)

# Each test runs `xmtp-push gateway` as its own process: a second or more.
pytestmark = pytest.mark.slow

NO_BADGE_IOS, NO_BADGE_ANDROID = "org.nobadge.ios", "org.nobadge.android"
# Two gcm apps of one service-account file: its own project, and another.
OWN_PROJECT, OTHER_PROJECT = "org.project.own", "org.project.other"
LOCAL = {"XMTP_PUSH_HTTP_HOST": "127.0.0.1", "XMTP_PUSH_HTTP_PORT": "0"}


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
