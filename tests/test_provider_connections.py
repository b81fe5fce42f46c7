"""Connections and credential health of the channels whose HTTP client is not ours to count (FCM's
httpx under firebase-admin, the webhooks' and Web Push's aiohttp), as a scrape reads them after
`sample_gauges`: requests held by the far end must show as connections in use, answered ones as
connections kept open, and a second round must reuse them. Web Push's VAPID key is judged only by
push services the app lists."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import REGISTRY

from app.core.apps import AppName, AppSource
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookProvider
from app.delivery.providers.webpush import WebPushConfig, WebPushProvider
from app.delivery.types import OutcomeKind, Push, WebhookExtras
from app.delivery.url_policy import UrlPolicy
from app.fanout.hints import fcm_push
from fakes.fake_fcm import FakeFcm, Reply
from fakes.fake_webpush import FakeWebPush
from fakes.webhook_receiver import Receiver
from tests.support.fcm import device, hint, new_provider
from tests.support.webpush import PAYLOAD, credentials

LOOPBACK = UrlPolicy(allow_insecure=True, allow_private_addresses=True)
HELD = 3


def sample(name: str, channel: str, app: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"channel": channel, "app": app})


def connections(channel: str, app: str) -> tuple[float | None, float | None, float | None]:
    """(open, in use, opened so far) as a scrape would read them."""
    return (
        sample("xmtp_push_provider_connections", channel, app),
        sample("xmtp_push_provider_connections_in_use", channel, app),
        sample("xmtp_push_provider_connects_total", channel, app),
    )


async def until_held(count: int, held: Callable[[], int]) -> None:
    for _ in range(500):
        if held() == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the far end never held {count} requests")


async def test_webhook_connections_in_use_kept_and_reused() -> None:
    app = f"t{secrets.token_hex(4)}"
    provider = WebhookProvider(LOOPBACK, timeout_seconds=10.0, app=AppName(AppSource.SETTINGS, app))
    try:
        async with Receiver() as receiver:
            provider.sample_gauges()
            assert connections("http", app) == (0, 0, 0)
            endpoint = receiver.endpoint(delays=(30.0,))
            pushes = [hook_push(endpoint.url, endpoint.key, f"m{i}") for i in range(HELD)]
            sends = [asyncio.create_task(provider.send(push)) for push in pushes]
            await until_held(HELD, receiver.active)
            provider.sample_gauges()
            assert connections("http", app) == (HELD, HELD, HELD)
            receiver.release()
            assert {o.kind for o in await asyncio.gather(*sends)} == {OutcomeKind.DELIVERED}
            provider.sample_gauges()
            assert connections("http", app) == (HELD, 0, HELD)  # kept alive for the next
            again = await provider.send(hook_push(endpoint.url, endpoint.key, "m9"))
            assert again.kind is OutcomeKind.DELIVERED
            provider.sample_gauges()
            assert connections("http", app) == (HELD, 0, HELD)  # reused, none opened
            # Webhooks carry no credentials of ours: no credential health is told for them.
            assert sample("xmtp_push_credentials_ok", "http", app) is None
    finally:
        await provider.close()
    provider.sample_gauges()
    assert connections("http", app)[:2] == (0, 0)


def hook_push(url: str, key: bytes, message_id: str) -> Push:
    return Push(url, b"{}", message_id=message_id, extras=WebhookExtras(key))


async def test_fcm_connections_in_use_and_kept(fcm_server: FakeFcm) -> None:
    fcm_server.reset()
    fcm_server.script("held", Reply(200, held=True))
    provider: FcmProvider = new_provider(fcm_server)
    try:
        provider.sample_gauges()
        assert connections("fcm", "default")[:2] == (0, 0)
        assert sample("xmtp_push_provider_connects_total", "fcm", "default") is None  # not told: not shown
        sends = [
            asyncio.create_task(provider.send(fcm_push(hint(), device(f"held.{i}")))) for i in range(HELD)
        ]
        await fcm_server.wait_for(HELD)
        provider.sample_gauges()
        # One connection per request in flight (HTTP/1.1 to the local endpoint).
        assert connections("fcm", "default")[:2] == (HELD, HELD)
        fcm_server.release()
        assert {o.kind for o in await asyncio.gather(*sends)} == {OutcomeKind.DELIVERED}
        provider.sample_gauges()
        assert connections("fcm", "default")[:2] == (HELD, 0)
    finally:
        await provider.close()
    provider.sample_gauges()
    assert connections("fcm", "default")[:2] == (0, 0)


def webpush(key: ec.EllipticCurvePrivateKey, app: str, *globs: str) -> WebPushProvider:
    config = WebPushConfig(credentials(key, allowed_endpoints=list(globs)), LOOPBACK)
    return WebPushProvider(config, 5.0, app=AppName(AppSource.SETTINGS, app))


async def test_web_push_connections_and_the_vapid_key_judged_by_listed_services() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    listed, anyone = f"t{secrets.token_hex(4)}", f"t{secrets.token_hex(4)}"
    trusting, open_to_all = webpush(key, listed, "127.0.0.1:*"), webpush(key, anyone)
    try:
        async with FakeWebPush() as service:
            assert sample("xmtp_push_credentials_ok", "webpush", listed) == 1  # the key loaded
            refusing, taking = service.subscribe(statuses=(403,)), service.subscribe()
            for provider in (trusting, open_to_all):
                refused = await provider.send(Push(refusing.endpoint, PAYLOAD, extras=refusing.keys))
                assert refused.kind is OutcomeKind.REJECTED
            # A listed push service refusing the VAPID authorization refuses our credentials; anyone
            # else's endpoint answering so says nothing of them.
            assert refused.credentials_refused is False
            assert sample("xmtp_push_credentials_ok", "webpush", listed) == 0
            assert sample("xmtp_push_credentials_refused_total", "webpush", listed) == 1
            assert sample("xmtp_push_credentials_ok", "webpush", anyone) == 1
            assert sample("xmtp_push_credentials_refused_total", "webpush", anyone) == 0
            delivered = await trusting.send(Push(taking.endpoint, PAYLOAD, extras=taking.keys))
            assert delivered.kind is OutcomeKind.DELIVERED
            assert sample("xmtp_push_credentials_ok", "webpush", listed) == 1
            trusting.sample_gauges()
            assert connections("webpush", listed) == (1, 0, 1)  # one connection, kept and reused
    finally:
        await trusting.close()
        await open_to_all.close()


async def test_a_listed_push_service_refusing_the_key_is_told_on_the_outcome() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    app = f"t{secrets.token_hex(4)}"
    provider = webpush(key, app, "127.0.0.1:*")
    try:
        async with FakeWebPush() as service:
            subscription = service.subscribe(statuses=(401,))
            outcome = await provider.send(Push(subscription.endpoint, PAYLOAD, extras=subscription.keys))
            assert (outcome.kind, outcome.credentials_refused) == (OutcomeKind.REJECTED, True)
    finally:
        await provider.close()
