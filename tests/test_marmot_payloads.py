"""XMTP_PUSH_MARMOT_APNS_MODE: what reaches APNs, byte for byte, for a trigger through a real relay, in
each mode (silent, generic_alert, mutable_alert), with and without a collapse id; FCM stays data-only."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.config import SettingsError, load_settings
from app.marmot.keys import ServerKey
from fakes.fake_apns import ApnsRequest, FakeApns
from fakes.fake_fcm import FakeFcm, FcmRequest
from tests.support.marmot import (  # noqa: F401  (fixtures)
    APNS_TOKEN,
    BUNDLE_ID,
    FCM_TOKEN,
    apns_chunk,
    fakes,
    fcm_chunk,
    key,
    marmot_settings,
    running_relay,
    send,
    serving,
)


async def pushed(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], **settings: Any
) -> tuple[ApnsRequest, FcmRequest]:
    """The APNs and the FCM request of one trigger holding a token of each, under `settings`."""
    apns, fcm = fakes
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url, **settings)):
        await send(relay, key, apns_chunk(key), fcm_chunk(key))
        (apns_request,) = await apns.wait_for(1)
        (fcm_request,) = await fcm.wait_for(1)
    return apns_request, fcm_request


def assert_data_only(request: FcmRequest) -> None:
    message = request.json()["message"]
    assert message["token"] == FCM_TOKEN
    assert message["data"] == {"content_available": "true"}
    assert message["android"]["priority"] == "HIGH"
    assert "notification" not in message


async def test_silent_is_the_default_and_unchanged(key: ServerKey, fakes: tuple[FakeApns, FakeFcm]) -> None:
    apns_request, fcm_request = await pushed(key, fakes)
    assert apns_request.body == b'{"aps":{"content-available":1}}'
    assert apns_request.header("apns-push-type") == "background"
    assert apns_request.header("apns-priority") == "5"
    assert apns_request.header("apns-collapse-id") is None
    assert_data_only(fcm_request)


@pytest.mark.parametrize(
    ("mode", "body"),
    [
        ("generic_alert", '{"aps":{"alert":{"title":"Nouveau message","body":"Ouvrez l\u2019app"}}}'),
        (
            "mutable_alert",
            '{"aps":{"alert":{"title":"Nouveau message","body":"Ouvrez l\u2019app"},"mutable-content":1}}',
        ),
    ],
    ids=["generic_alert", "mutable_alert"],
)
async def test_an_alert_mode_shows_the_title_and_body_at_priority_10(
    mode: str, body: str, key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns_request, fcm_request = await pushed(
        key,
        fakes,
        marmot_apns_mode=mode,
        marmot_alert_title="Nouveau message",
        marmot_alert_body="Ouvrez l\u2019app",
        marmot_apns_collapse_id="marmot-wake",
    )
    assert apns_request.token == APNS_TOKEN
    assert apns_request.body == body.encode("utf-8")
    assert apns_request.header("apns-push-type") == "alert"
    assert apns_request.header("apns-priority") == "10"
    assert apns_request.header("apns-topic") == BUNDLE_ID
    assert apns_request.header("apns-collapse-id") == "marmot-wake"
    assert_data_only(fcm_request)


async def test_the_default_alert_has_a_title_and_no_body(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns_request, _ = await pushed(key, fakes, marmot_apns_mode="generic_alert")
    assert apns_request.body == b'{"aps":{"alert":{"title":"New message"}}}'
    assert apns_request.header("apns-collapse-id") is None


async def test_a_collapse_id_goes_with_silent_pushes_too(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns_request, _ = await pushed(key, fakes, marmot_apns_collapse_id="wake")
    assert apns_request.body == b'{"aps":{"content-available":1}}'
    assert apns_request.header("apns-collapse-id") == "wake"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("XMTP_PUSH_MARMOT_APNS_MODE", "loud"),
        ("XMTP_PUSH_MARMOT_APNS_COLLAPSE_ID", "x" * 65),
        ("XMTP_PUSH_MARMOT_APNS_COLLAPSE_ID", "é"),
        ("XMTP_PUSH_MARMOT_ALERT_TITLE", ""),
    ],
    ids=["mode", "long-collapse-id", "non-ascii-collapse-id", "empty-title"],
)
def test_a_bad_payload_setting_is_refused_naming_it(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert variable in str(error.value)
