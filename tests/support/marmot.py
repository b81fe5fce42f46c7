"""The Marmot tests' outside world: a real Nostr relay on loopback (rust-nostr's LocalRelay, through the
nostr-sdk bindings), senders that gift-wrap triggers with nostr-sdk, and a TCP proxy that can go silent.

Only the relay and the senders are someone else's code; the token layer inside a trigger is ours.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import nostr_sdk as nostr
import pytest
from prometheus_client import REGISTRY

from app.core.config import Settings
from app.delivery.registry import ProviderRegistry, default_apps
from app.marmot import secp
from app.marmot.keys import ServerKey
from app.marmot.tokens import ENCRYPTED_TOKEN_SIZE, Platform, encrypt_token
from fakes import keys as app_keys
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.keys import service_account
from tests.support import eventually, make_settings
from tests.support.fakes import fakes  # noqa: F401  (a fixture the Marmot tests import from here)
from tests.support.proxy import TcpProxy
from tests.support.redis_cluster import ClusterUnderTest
from workers.marmot_server import MarmotServer, open_marmot, shared_server
from workers.server import MARMOT_CHANNELS

MARMOT_TAGS = (("v", "marmot-push-v1"),)


# Enough for a burst test: LocalRelay's own default refuses all but a few events a second.
RAISED_RATE_LIMIT = nostr.RateLimit(max_reqs=1000, notes_per_minute=1_000_000_000)


class Relay:
    """A LocalRelay on 127.0.0.1; `stop` and `start` again keep its port (and lose its events)."""

    def __init__(self, *, auth_dm: bool = False, rate_limit: nostr.RateLimit | None = None) -> None:
        self.auth_dm = auth_dm
        self.rate_limit = rate_limit
        self.port: int | None = None
        self._relay: nostr.LocalRelay | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def start(self) -> Relay:
        builder = nostr.LocalRelayBuilder().addr("127.0.0.1")
        if self.port is not None:
            builder = builder.port(self.port)
        if self.auth_dm:  # NIP-42: gift wraps go only to the authenticated key they are addressed to
            builder = builder.auth_dm(True)
        if self.rate_limit is not None:
            builder = builder.rate_limit(self.rate_limit)
        self._relay = builder.build()
        await self._relay.run()
        self.port = int(str(await self._relay.url()).rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        if self._relay is not None:
            self._relay.shutdown()
            self._relay = None

    async def publish(self, event: nostr.Event) -> None:
        """Publish through nostr-sdk's client, waiting for the relay's OK."""
        client = nostr.Client()
        try:
            await client.add_relay(nostr.RelayUrl.parse(self.url))
            await client.connect()
            output = await client.send_event(event)
            assert output.success, f"the relay refused the event: {output.failed}"
        finally:
            await client.shutdown()

    async def publish_json(self, event: dict[str, Any]) -> None:
        await self.publish(nostr.Event.from_json(json.dumps(event)))

    async def publish_all(self, events: Sequence[dict[str, Any]]) -> None:
        """Send every event over one websocket as fast as the relay takes them, then read its OKs."""
        async with aiohttp.ClientSession() as http, http.ws_connect(self.url, max_msg_size=0) as ws:
            for event in events:
                await ws.send_str(json.dumps(["EVENT", event]))
            accepted: list[bool] = []
            while len(accepted) < len(events):
                answer = json.loads((await ws.receive(timeout=30)).data)
                if answer[0] == "OK":
                    accepted.append(answer[2])
        assert all(accepted), f"the relay refused {accepted.count(False)} of {len(events)} events"

    async def query(self, filter_: dict[str, Any], timeout: float = 5.0) -> list[dict[str, Any]]:
        """The stored events matching one filter, read over a plain websocket."""
        events = []
        async with aiohttp.ClientSession() as http, http.ws_connect(self.url) as ws:
            await ws.send_str(json.dumps(["REQ", "q", filter_]))
            async with asyncio.timeout(timeout):
                async for message in ws:
                    body = json.loads(message.data)
                    if body[0] == "EVENT":
                        events.append(body[2])
                    elif body[0] in ("EOSE", "CLOSED"):
                        break
        return events


@contextlib.asynccontextmanager
async def running_relay(
    *, auth_dm: bool = False, rate_limit: nostr.RateLimit | None = None
) -> AsyncIterator[Relay]:
    relay = await Relay(auth_dm=auth_dm, rate_limit=rate_limit).start()
    try:
        yield relay
    finally:
        relay.stop()


def gift_wrap(
    server_pubkey_hex: str,
    content: str,
    *,
    kind: int = 446,
    tags: Sequence[Sequence[str]] = MARMOT_TAGS,
) -> nostr.Event:
    """A trigger as a Marmot sender makes one: a rumor from a fresh key, sealed and gift-wrapped
    (NIP-59) to the server by nostr-sdk."""
    sender = nostr.Keys.generate()
    rumor = (
        nostr.EventBuilder(nostr.Kind(kind), content)
        .tags([nostr.Tag.parse(list(tag)) for tag in tags])
        .finalize_unsigned(sender.public_key())
    )
    return nostr.nip59_make_gift_wrap(sender, nostr.PublicKey.parse(server_pubkey_hex), rumor)


def event_dict(event: nostr.Event) -> dict[str, Any]:
    return dict(json.loads(event.as_json()))


class SilentProxy(TcpProxy):
    """A proxy in front of a relay, whose `silent` hangs it (see TcpProxy)."""

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def b64(content: bytes) -> str:
    return base64.b64encode(content).decode("ascii")


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def triggers(result: str) -> float:
    return sample("xmtp_push_marmot_triggers_total", {"result": result})


def tokens(platform: str, outcome: str) -> float:
    return sample("xmtp_push_marmot_tokens_total", {"platform": platform, "outcome": outcome})


# --------------------------------------------------------------------------- a server under test


APNS_TOKEN = "a1" * 32
FCM_TOKEN = "fcm-registration-token:" + "x" * 140
BUNDLE_ID = "org.example.app"


def marmot_settings(
    fakes: tuple[FakeApns, FakeFcm], key: ServerKey, *relays: str, **overrides: Any
) -> Settings:
    apns, fcm = fakes
    values: dict[str, Any] = {
        "apns_endpoint": apns.endpoint,
        "apns_ca_file": apns.tls.ca_file,
        "apns_bundle_id": BUNDLE_ID,
        "fcm_service_account": service_account(token_uri=fcm.token_uri),
        "fcm_endpoint": fcm.endpoint,
        "marmot_secret_key": key.secret.hex(),
        "marmot_relays": ",".join(relays),
    }
    values.update(overrides)
    return make_settings("sqlite+aiosqlite:///unused.db", **values)


@contextlib.asynccontextmanager
async def serving(settings: Settings, redis: Any = None) -> AsyncIterator[MarmotServer]:
    """The server as `xmtp-push marmot` assembles it (its own APNs and FCM providers), subscribed;
    sharing its wraps through the Redis client `redis` (a cluster's, say) when one is given."""
    apps = [app for app in default_apps(settings) if app.channel in MARMOT_CHANNELS]
    providers = ProviderRegistry.build(apps, settings.provider_timeout_seconds)
    stop = asyncio.Event()
    try:
        async with _server(settings, providers, redis) as server:
            task = asyncio.create_task(server.run(stop))
            try:
                await eventually(
                    lambda: len(server.subscribed) == len(settings.marmot_relays), what="subscribed"
                )
                yield server
            finally:
                stop.set()
                await asyncio.wait_for(task, 15)
    finally:
        await providers.close()


@contextlib.asynccontextmanager
async def _server(settings: Settings, providers: ProviderRegistry, redis: Any) -> AsyncIterator[MarmotServer]:
    if redis is None:
        async with open_marmot(settings, providers) as server:
            yield server
        return
    assert settings.marmot_secret_key is not None
    yield shared_server(
        settings, ServerKey.parse(settings.marmot_secret_key.get_secret_value()), providers, redis
    )


# --------------------------------------------------------------------------- the Redis the servers share


@pytest.fixture(params=("redis", "cluster"))
def shared_redis_url(request: pytest.FixtureRequest) -> str:
    """The Redis the servers share, once each: the single test Redis DB (the `redis_url` fixture of
    tests/support/pipeline.py, which the test module imports), and the test Redis Cluster (the
    `redis_cluster` fixture of tests/support/redis_cluster.py), emptied first."""
    if request.param == "cluster":
        cluster: ClusterUnderTest = request.getfixturevalue("redis_cluster")
        cluster.flush()
        return cluster.url
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def key() -> ServerKey:
    return ServerKey(secp.fresh_secret())


def apns_chunk(key: ServerKey, token: str = APNS_TOKEN) -> bytes:
    return encrypt_token(key.public_x, Platform.APNS, token)


def fcm_chunk(key: ServerKey, token: str = FCM_TOKEN) -> bytes:
    return encrypt_token(key.public_x, Platform.FCM, token)


def padding() -> bytes:
    return os.urandom(ENCRYPTED_TOKEN_SIZE)


async def send(relay: Relay, key: ServerKey, *chunks: bytes) -> dict[str, Any]:
    """Gift-wrap a trigger holding `chunks` with nostr-sdk and publish it; the wrap as JSON."""
    wrap = gift_wrap(key.public_hex, b64(b"".join(chunks)))
    await relay.publish(wrap)
    return event_dict(wrap)


async def settle(result: str, before: float, count: int = 1) -> None:
    await eventually(lambda: triggers(result) >= before + count, what=f"{count} trigger(s) {result}")
    await asyncio.sleep(0.2)  # anything more it was going to send, it has sent


def marmot_env(
    key: ServerKey, relay_url: str, http_port: int, apns: FakeApns, fcm: FakeFcm
) -> dict[str, str]:
    """The settings of `xmtp-push marmot` as a subprocess, pointed at the relay and the fakes."""
    return {
        "XMTP_PUSH_MARMOT_SECRET_KEY": key.secret.hex(),
        "XMTP_PUSH_MARMOT_RELAYS": relay_url,
        "XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS": "true",  # the tests' relays: ws:// on loopback
        "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
        "XMTP_PUSH_HTTP_PORT": str(http_port),
        "XMTP_PUSH_APNS_KEY": app_keys.apns_key_pem(),
        "XMTP_PUSH_APNS_KEY_ID": "KEYID12345",
        "XMTP_PUSH_APNS_TEAM_ID": "TEAMID1234",
        "XMTP_PUSH_APNS_BUNDLE_ID": "org.example.app",
        "XMTP_PUSH_APNS_ENDPOINT": apns.endpoint,
        "XMTP_PUSH_APNS_CA_FILE": apns.tls.ca_file,
        "XMTP_PUSH_FCM_SERVICE_ACCOUNT": app_keys.service_account(token_uri=fcm.token_uri),
        "XMTP_PUSH_FCM_ENDPOINT": fcm.endpoint,
    }
