"""The provider registry: several apps of one channel in one process, and the neutral push on the wire.

Two APNs apps with their own keys, key ids, teams and bundle ids send through two local HTTP/2
APNs servers from one registry; each server must see only its app's requests, signed with its
app's key. The fields of a push that XMTP hints leave at their defaults (alert, high priority,
expiry, extras) are checked on the wire too, as the Matrix and Marmot sources will use them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.core.apps import DEFAULT_APP, AppName, AppSource
from app.core.channels import Channel
from app.delivery.credentials import load_apns
from app.delivery.registry import ChannelApp, ProviderRegistry, default_apps
from app.delivery.types import ApnsExtras, OutcomeKind, Priority, Push, PushKind
from fakes.fake_apns import FakeApns
from fakes.tls import TlsFiles
from tests.support import make_settings

APPS = {
    # app id: (key id, team id, bundle id)
    "org.example.one": ("KEYONE1234", "TEAMONE123", "org.example.one"),
    "org.example.two": ("KEYTWO1234", "TEAMTWO123", "org.example.two.beta"),
}
NAMES = {"key": "apps.test.keyfile", "ca_file": "apps.test.ca_file"}


def pem(key: ec.EllipticCurvePrivateKey) -> str:
    encoding, private = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, private, serialization.NoEncryption()).decode()


@pytest.fixture(scope="module")
def fakes(tls: TlsFiles) -> Iterator[dict[str, FakeApns]]:
    with FakeApns(tls) as one, FakeApns(tls) as two:
        yield {"org.example.one": one, "org.example.two": two}


@pytest.fixture(scope="module")
def keys() -> dict[str, ec.EllipticCurvePrivateKey]:
    return {app: ec.generate_private_key(ec.SECP256R1()) for app in APPS}


@pytest.fixture
async def registry(
    fakes: dict[str, FakeApns], keys: dict[str, ec.EllipticCurvePrivateKey], tls: TlsFiles
) -> AsyncIterator[ProviderRegistry]:
    for fake in fakes.values():
        fake.reset()
    apps = []
    for app, (key_id, team_id, bundle_id) in APPS.items():
        credentials = load_apns(
            pem(keys[app]),
            key_id,
            team_id,
            bundle_id,
            endpoint=fakes[app].endpoint,
            ca_file=tls.ca_file,
            names=NAMES,
        )
        apps.append(ChannelApp(Channel.APNS, AppName(AppSource.MATRIX, app), credentials))
    built = ProviderRegistry.build(apps, timeout_seconds=5.0)
    yield built
    await built.close()


def alert(token: str, **fields: object) -> Push:
    return Push(token, b'{"aps":{"alert":"hi"}}', PushKind.ALERT, Priority.HIGH, **fields)  # type: ignore[arg-type]


async def test_two_apns_apps_send_from_one_process_each_with_its_own_key_and_topic(
    registry: ProviderRegistry, fakes: dict[str, FakeApns], keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    one, two = (
        registry.get(Channel.APNS, AppName(AppSource.MATRIX, f"org.example.{n}")) for n in ("one", "two")
    )
    assert one is not None and two is not None and one is not two
    assert registry.get("apns", DEFAULT_APP) is None and len(registry) == 2

    outcomes = await asyncio.gather(
        *(one.send(alert(f"ok.one{i}")) for i in range(3)), *(two.send(alert(f"ok.two{i}")) for i in range(3))
    )

    assert [o.kind for o in outcomes] == [OutcomeKind.DELIVERED] * 6
    for app, (key_id, team_id, bundle_id) in APPS.items():
        requests = fakes[app].requests
        suffix = app.rsplit(".", 1)[1]
        assert sorted(r.token for r in requests) == [f"ok.{suffix}{i}" for i in range(3)]
        for request in requests:
            assert request.header("apns-topic") == bundle_id
            assert jwt.get_unverified_header(request.jwt)["kid"] == key_id
            claims = jwt.decode(request.jwt, keys[app].public_key(), algorithms=["ES256"])
            assert claims["iss"] == team_id


async def test_an_alert_push_carries_its_priority_expiry_collapse_id_and_extras(
    registry: ProviderRegistry, fakes: dict[str, FakeApns]
) -> None:
    provider = registry.get(Channel.APNS, AppName(AppSource.MATRIX, "org.example.one"))
    assert provider is not None
    expires_at = int(time.time()) + 3600
    extras = ApnsExtras(push_type="voip", apns_topic="org.example.one.voip")

    outcome = await provider.send(
        alert("ok.alert", collapse_id="room-1", expires_at=expires_at, extras=extras)
    )

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = fakes["org.example.one"].requests
    assert request.body == b'{"aps":{"alert":"hi"}}'  # sent as rendered, byte for byte
    assert request.header("apns-priority") == "10"
    assert request.header("apns-push-type") == "voip"
    assert request.header("apns-topic") == "org.example.one.voip"
    assert request.header("apns-collapse-id") == "room-1"
    assert abs(int(request.header("apns-expiration") or 0) - expires_at) <= 1


async def test_pushes_apple_would_refuse_are_rejected_without_a_request(
    registry: ProviderRegistry, fakes: dict[str, FakeApns]
) -> None:
    provider = registry.get(Channel.APNS, AppName(AppSource.MATRIX, "org.example.two"))
    assert provider is not None
    too_big = Push("ok.big", b"{" + b" " * 4095 + b"}")
    long_collapse = alert("ok.collapse", collapse_id="é" * 33)  # 66 bytes in UTF-8
    not_bytes = Push("ok.map", {"key": "value"})
    for push in (too_big, long_collapse, not_bytes):
        assert (await provider.send(push)).kind is OutcomeKind.REJECTED
    assert fakes["org.example.two"].requests == []


def test_the_flat_settings_are_the_default_app_of_each_channel() -> None:
    every = make_settings("sqlite+aiosqlite:///unused.db", webhook_enabled=True)
    assert [(a.channel, a.app) for a in default_apps(every)] == [
        ("apns", DEFAULT_APP),
        ("fcm", DEFAULT_APP),
        ("http", DEFAULT_APP),
    ]
    only_fcm = make_settings("sqlite+aiosqlite:///unused.db", apns_key=None, webhook_enabled=False)
    assert [(a.channel, a.app) for a in default_apps(only_fcm)] == [("fcm", DEFAULT_APP)]


def test_a_gateway_app_is_apart_from_a_settings_app_of_the_same_name_and_labelled_by_its_source() -> None:
    settings_app, gateway_app = AppName(AppSource.SETTINGS, "default"), AppName(AppSource.MATRIX, "default")
    assert settings_app == DEFAULT_APP and gateway_app != DEFAULT_APP
    assert (settings_app.label, gateway_app.label) == ("default", "matrix:default")


def test_an_app_whose_credentials_are_another_channels_is_refused_before_any_provider_is_built() -> None:
    every = make_settings("sqlite+aiosqlite:///unused.db", webhook_enabled=True)
    apns, fcm, _ = default_apps(every)
    swapped = ChannelApp(Channel.FCM, AppName(AppSource.MATRIX, "swapped"), apns.credentials)
    with pytest.raises(TypeError) as refused:
        ProviderRegistry.build([apns, fcm, swapped], 5.0)
    assert str(refused.value) == "the fcm channel takes FcmCredentials, not ApnsCredentials"
