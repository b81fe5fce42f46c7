"""`xmtp-push gateway` as the operator runs it: the console script in a child process, its answers and
its log lines, against the local APNs and FCM fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support.matrix import (
    GatewayProcess,
    apns_app,
    device,
    gateway_process,
    gcm_app,
    write_config,
    write_key_files,
)

# Each test runs `xmtp-push gateway` as its own process: a second or more.
pytestmark = pytest.mark.slow

NO_BADGE_IOS, NO_BADGE_ANDROID = "org.nobadge.ios", "org.nobadge.android"
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
