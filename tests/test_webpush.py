"""The Web Push channel against a push service on a real local port.

The fake service decrypts every push with http_ece using the subscriber's private key and verifies
its VAPID token with py_vapid; the provider, pywebpush's encryption, aiohttp and the URL policy are
ours, unchanged. Answers map to outcomes from the module's table; refused endpoints (a private
address, a host outside `allowed_endpoints`) are never contacted.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.core.apps import AppName, AppSource
from app.core.channels import Channel
from app.core.config import SettingsError
from app.delivery.credentials import load_webpush
from app.delivery.providers.webpush import (
    VapidTokens,
    WebPushConfig,
    WebPushProvider,
    collapse_header,
    endpoint_allowed,
)
from app.delivery.registry import ChannelApp, ProviderRegistry
from app.delivery.types import OutcomeKind, Priority, Push, WebPushKeys
from app.delivery.url_policy import UrlPolicy
from fakes.fake_webpush import FakeWebPush, b64url
from tests.support.webpush import NAMES, PAYLOAD, credentials, pem

LOOPBACK = UrlPolicy(allow_insecure=True, allow_private_addresses=True)
PUBLIC_ONLY = UrlPolicy(allow_insecure=True)


@pytest.fixture(scope="module")
def vapid_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_b64(key: ec.EllipticCurvePrivateKey) -> str:
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64url(point)


@pytest.fixture
async def provider(vapid_key: ec.EllipticCurvePrivateKey) -> AsyncIterator[WebPushProvider]:
    sender = WebPushProvider(
        WebPushConfig(credentials(vapid_key, ttl=120), LOOPBACK), 5.0, app=AppName(AppSource.MATRIX, "web")
    )
    yield sender
    await sender.close()


def push(endpoint: str, keys: WebPushKeys, **fields: object) -> Push:
    return Push(endpoint, PAYLOAD, extras=keys, **fields)  # type: ignore[arg-type]


async def test_a_push_arrives_encrypted_to_the_subscription_with_a_valid_vapid_token(
    service: FakeWebPush, provider: WebPushProvider, vapid_key: ec.EllipticCurvePrivateKey
) -> None:
    subscription = service.subscribe()
    outcome = await provider.send(
        push(
            subscription.endpoint, subscription.keys, priority=Priority.HIGH, collapse_id="!room:example.org"
        )
    )
    assert outcome.kind is OutcomeKind.DELIVERED
    assert service.failures == []
    [pushed] = subscription.pushes
    assert pushed.payload == PAYLOAD
    assert PAYLOAD not in pushed.body
    assert pushed.vapid_key == public_b64(vapid_key)
    assert pushed.claims["aud"] == service.base_url
    assert pushed.claims["sub"] == "mailto:ops@example.org"
    assert time.time() + 11 * 3600 < pushed.claims["exp"] <= time.time() + 12 * 3600
    assert pushed.headers["ttl"] == "120"
    assert pushed.headers["urgency"] == "normal"
    assert pushed.headers["topic"] == collapse_header("!room:example.org")
    assert len(pushed.headers["topic"]) == 32
    assert "user-agent" not in pushed.headers


async def test_normal_priority_is_low_urgency_and_an_expiry_sets_the_ttl(
    service: FakeWebPush, provider: WebPushProvider
) -> None:
    subscription = service.subscribe()
    outcome = await provider.send(
        push(subscription.endpoint, subscription.keys, expires_at=int(time.time()) + 30)
    )
    assert outcome.kind is OutcomeKind.DELIVERED
    [pushed] = subscription.pushes
    assert pushed.headers["urgency"] == "low"
    assert 28 <= int(pushed.headers["ttl"]) <= 30
    assert "topic" not in pushed.headers


async def test_every_push_is_encrypted_afresh_and_one_token_serves_an_origin(
    service: FakeWebPush, provider: WebPushProvider
) -> None:
    subscriptions = [service.subscribe() for _ in range(3)]
    outcomes = await asyncio.gather(*(provider.send(push(s.endpoint, s.keys)) for s in subscriptions * 2))
    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    pushes = service.all_pushes()
    assert [p.payload for p in pushes] == [PAYLOAD] * 6
    assert len({p.body for p in pushes}) == 6  # a new salt and ephemeral key each time
    assert len({p.headers["authorization"] for p in pushes}) == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, OutcomeKind.DEAD),
        (410, OutcomeKind.DEAD),
        (500, OutcomeKind.FAILED),
        (502, OutcomeKind.FAILED),
        (400, OutcomeKind.REJECTED),
        (401, OutcomeKind.REJECTED),
        (403, OutcomeKind.REJECTED),
        (413, OutcomeKind.REJECTED),
        (301, OutcomeKind.REJECTED),
    ],
)
async def test_answers_map_to_outcomes(
    service: FakeWebPush, provider: WebPushProvider, status: int, kind: OutcomeKind
) -> None:
    subscription = service.subscribe(statuses=(status,), location="http://127.0.0.1:1/elsewhere")
    outcome = await provider.send(push(subscription.endpoint, subscription.keys))
    assert outcome.kind is kind
    assert len(subscription.pushes) == 1  # redirects are not followed


async def test_too_many_requests_waits_for_its_retry_after(
    service: FakeWebPush, provider: WebPushProvider
) -> None:
    subscription = service.subscribe(statuses=(429,), **{"retry-after": "42"})
    outcome = await provider.send(push(subscription.endpoint, subscription.keys))
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.delay_seconds == 42.0


async def test_a_private_address_is_refused_without_a_request(
    service: FakeWebPush, vapid_key: ec.EllipticCurvePrivateKey
) -> None:
    subscription = service.subscribe()
    sender = WebPushProvider(WebPushConfig(credentials(vapid_key), PUBLIC_ONLY), 5.0)
    try:
        outcome = await sender.send(push(subscription.endpoint, subscription.keys))
    finally:
        await sender.close()
    assert outcome.kind is OutcomeKind.REJECTED
    assert subscription.pushes == [] and service.failures == []


async def test_an_endpoint_outside_allowed_endpoints_is_refused_without_a_request(
    service: FakeWebPush, vapid_key: ec.EllipticCurvePrivateKey
) -> None:
    subscription = service.subscribe()
    allowed = WebPushProvider(
        WebPushConfig(credentials(vapid_key, allowed_endpoints=["127.0.0.?:*"]), LOOPBACK), 5.0
    )
    refused = WebPushProvider(
        WebPushConfig(credentials(vapid_key, allowed_endpoints=["*.push.example.org"]), LOOPBACK), 5.0
    )
    try:
        assert (
            await refused.send(push(subscription.endpoint, subscription.keys))
        ).kind is OutcomeKind.REJECTED
        assert subscription.pushes == []
        assert (
            await allowed.send(push(subscription.endpoint, subscription.keys))
        ).kind is OutcomeKind.DELIVERED
        assert len(subscription.pushes) == 1
    finally:
        await allowed.close()
        await refused.close()


def test_allowed_endpoint_globs_match_the_host_and_the_port_as_written() -> None:
    globs = ("*.push.example.org", "updates.example.net:8443")
    assert endpoint_allowed("https://fcm.push.example.org/send/x", globs)
    assert endpoint_allowed("https://FCM.Push.Example.org/send/x", globs)
    assert not endpoint_allowed("https://push.example.org/send/x", globs)
    assert not endpoint_allowed("https://fcm.push.example.org:8443/send/x", globs)
    assert endpoint_allowed("https://updates.example.net:8443/wpush", globs)
    assert not endpoint_allowed("https://updates.example.net/wpush", globs)
    assert not endpoint_allowed("https://evil.example.com/?x=.push.example.org", globs)
    assert not endpoint_allowed("https://a.push.example.org.evil.com/", globs)
    assert endpoint_allowed("https://anything.example.com/", ())


async def test_keys_that_cannot_be_encrypted_to_make_the_subscription_dead(
    service: FakeWebPush, provider: WebPushProvider
) -> None:
    subscription = service.subscribe()
    good = subscription.keys
    bad_keys = [
        WebPushKeys(p256dh=b64url(b"\x04" + bytes(64)), auth=good.auth),  # not a point on the curve
        WebPushKeys(p256dh="not base64!", auth=good.auth),
        WebPushKeys(p256dh=good.p256dh, auth=b64url(bytes(8))),  # the auth secret is 16 bytes
    ]
    for keys in bad_keys:
        assert (await provider.send(push(subscription.endpoint, keys))).kind is OutcomeKind.DEAD
    assert subscription.pushes == []


async def test_a_push_without_keys_or_payload_is_rejected(
    provider: WebPushProvider, service: FakeWebPush
) -> None:
    subscription = service.subscribe()
    assert (await provider.send(Push(subscription.endpoint, PAYLOAD))).kind is OutcomeKind.REJECTED
    assert (await provider.send(Push(subscription.endpoint, b"", extras=subscription.keys))).kind is (
        OutcomeKind.REJECTED
    )
    assert subscription.pushes == []


async def test_a_service_that_never_answers_is_transient_within_the_bound(
    vapid_key: ec.EllipticCurvePrivateKey,
) -> None:
    answered = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await answered.wait()
        return web.Response(status=201)

    app = web.Application()
    app.router.add_post("/push/1", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/push/1"
    keys = FakeWebPush().subscribe().keys
    sender = WebPushProvider(WebPushConfig(credentials(vapid_key), LOOPBACK), 0.5)
    started = time.monotonic()
    try:
        outcome = await sender.send(push(url, keys))
    finally:
        answered.set()
        await sender.close()
        await runner.cleanup()
    assert outcome.kind is OutcomeKind.FAILED
    assert time.monotonic() - started < 2.0


async def test_the_registry_builds_the_channel(
    service: FakeWebPush, vapid_key: ec.EllipticCurvePrivateKey
) -> None:
    config = WebPushConfig(credentials(vapid_key), LOOPBACK)
    web = AppName(AppSource.MATRIX, "org.example.web")
    registry = ProviderRegistry.build([ChannelApp(Channel.WEBPUSH, web, config)], 5.0)
    try:
        sender = registry.get(Channel.WEBPUSH, web)
        assert sender is not None
        subscription = service.subscribe()
        assert (
            await sender.send(push(subscription.endpoint, subscription.keys))
        ).kind is OutcomeKind.DELIVERED
    finally:
        await registry.close()


def test_a_vapid_token_is_renewed_before_it_expires(vapid_key: ec.EllipticCurvePrivateKey) -> None:
    now = [1_000_000.0]
    tokens = VapidTokens(credentials(vapid_key), clock=lambda: now[0])
    first = tokens.header("https://push.example.org")
    now[0] += 10 * 3600
    assert tokens.header("https://push.example.org") == first
    assert tokens.header("https://other.example.org") != first
    now[0] += 1.5 * 3600  # 30 minutes before the first token's expiry
    assert tokens.header("https://push.example.org") != first


# --- the credentials loader ---------------------------------------------------------------------


def test_the_vapid_key_loads_as_pem_text_a_pem_file_or_base64url(
    vapid_key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    key_file = tmp_path / "vapid.pem"
    key_file.write_text(pem(vapid_key))
    raw = vapid_key.private_numbers().private_value.to_bytes(32, "big")
    der = vapid_key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for value in (pem(vapid_key), str(key_file), b64url(raw), base64.urlsafe_b64encode(der).decode()):
        loaded = load_webpush(value, "mailto:ops@example.org", names=NAMES)
        assert loaded.vapid.private_key.private_numbers() == vapid_key.private_numbers()
        assert loaded.contact == "mailto:ops@example.org"
    defaults = load_webpush(str(key_file), "https://example.org", names=NAMES)
    assert (defaults.ttl_seconds, defaults.max_connections, defaults.allowed_endpoints) == (900, 20, ())
    assert defaults.contact == "https://example.org"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"vapid_private_key": "/nonexistent/vapid.pem"}, "apps.web.vapid_private_key: not a readable P-256"),
        ({"vapid_private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n"}, "apps.web.vapid_private_key: not a"),
        ({"vapid_contact_email": ""}, "apps.web.vapid_contact_email: required"),
        ({"vapid_contact_email": "not an address"}, "apps.web.vapid_contact_email: not an e-mail"),
        ({"ttl": -1}, "apps.web.ttl: must be a whole number of seconds"),
        ({"ttl": "900"}, "apps.web.ttl: must be a whole number of seconds"),
        ({"ttl": True}, "apps.web.ttl: must be a whole number of seconds"),
        ({"max_connections": 0}, "apps.web.max_connections: must be a whole number of at least 1"),
        ({"allowed_endpoints": "*.example.org"}, "apps.web.allowed_endpoints: must be a list of host globs"),
        ({"allowed_endpoints": ["ok.example.org", 3]}, "apps.web.allowed_endpoints: every entry"),
    ],
)
def test_a_bad_value_stops_loading_naming_the_key_and_not_the_secret(
    vapid_key: ec.EllipticCurvePrivateKey, values: dict[str, object], message: str
) -> None:
    arguments: dict[str, object] = {
        "vapid_private_key": pem(vapid_key),
        "vapid_contact_email": "ops@example.org",
    }
    arguments.update(values)
    with pytest.raises(SettingsError) as raised:
        load_webpush(names=NAMES, **arguments)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)
    assert "PRIVATE KEY" not in str(raised.value)


def test_a_key_on_another_curve_is_refused() -> None:
    other = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(SettingsError) as raised:
        load_webpush(pem(other), "ops@example.org", names=NAMES)
    assert str(raised.value).startswith("apps.web.vapid_private_key: not a readable P-256")
