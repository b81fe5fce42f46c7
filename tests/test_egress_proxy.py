"""Provider traffic through an egress proxy (HTTP CONNECT, as Sygnal's): APNs, FCM, its OAuth token
endpoint and Web Push, from a sygnal.yaml's `proxy:` or HTTPS_PROXY, with Basic credentials,
bypassed by NO_PROXY, and a refusing proxy a transient failure told in one line. The proxy counts
the tunnels it opens, so each test shows which connections went through it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fakes.connect_proxy import ConnectProxy
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.fake_webpush import FakeWebPush
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Receiver
from tests.support import make_settings, running
from tests.support.egress import Providers, every_device, gateway_config, gateway_process, provider_env
from tests.support.matrix import device, event_id_only
from tests.support.ops import channel_env, register, xmtp_push

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

USER, PASSWORD = "pushes", "s3cret-proxy-word"


@pytest.fixture(scope="module")
def fcm(tls: TlsFiles) -> Iterator[FakeFcm]:
    with FakeFcm(tls=tls) as fake:
        yield fake


@pytest.fixture
async def providers(tls: TlsFiles, apns_server: FakeApns, fcm: FakeFcm) -> AsyncIterator[Providers]:
    apns_server.reset()
    fcm.reset()
    async with FakeWebPush(tls=tls, name="localhost") as webpush:
        yield Providers(tls, apns_server, fcm, webpush)


def assert_delivered_once_each(providers: Providers, answer_json: object) -> None:
    assert answer_json == {"rejected": []}
    assert len(providers.apns.requests) == 1
    assert len(providers.fcm.requests) == 1
    assert len(providers.fcm.token_requests) == 1
    assert len(providers.webpush.all_pushes()) == 1


async def test_the_sygnal_yaml_proxy_carries_every_provider_connection_with_basic_auth(
    tmp_path: Path, providers: Providers
) -> None:
    async with ConnectProxy(credentials=(USER, PASSWORD)) as proxy:
        config = gateway_config(tmp_path, providers, proxy=proxy.url)
        async with gateway_process(config, provider_env(providers.tls)) as gateway:
            answer = await gateway.notify(every_device(providers.webpush.subscribe()))
            assert answer.status_code == 200, gateway.output()
            assert_delivered_once_each(providers, answer.json())
            ports = providers.ports()
            # APNs, FCM's send and its OAuth token fetch (two clients, two tunnels), Web Push.
            assert sorted(proxy.tunnels) == sorted(
                [
                    f"127.0.0.1:{ports['apns']}",
                    *[f"127.0.0.1:{ports['fcm']}"] * 2,
                    f"127.0.0.1:{ports['webpush']}",
                ]
            )
            assert proxy.refused == []
            # The Web Push endpoint is https://localhost:...: the proxy is asked for the address the
            # URL policy checked, not the name (TLS still verified it: the certificate names localhost).
            assert "localhost" not in " ".join(proxy.tunnels)
            assert PASSWORD not in gateway.output()


async def test_https_proxy_from_the_environment_carries_them(tmp_path: Path, providers: Providers) -> None:
    async with ConnectProxy() as proxy:
        config = gateway_config(tmp_path, providers)
        env = provider_env(providers.tls, HTTPS_PROXY=proxy.url)
        async with gateway_process(config, env) as gateway:
            answer = await gateway.notify(every_device(providers.webpush.subscribe()))
            assert answer.status_code == 200, gateway.output()
            assert_delivered_once_each(providers, answer.json())
            assert len(proxy.tunnels) == 4
            assert {proxy.tunnels_to(port) for port in providers.ports().values()} == {1, 2}


async def test_no_proxy_hosts_go_direct(tmp_path: Path, providers: Providers) -> None:
    """The Web Push service's host (localhost) is listed: it goes direct, APNs and FCM through."""
    async with ConnectProxy() as proxy:
        config = gateway_config(tmp_path, providers, proxy=proxy.url)
        env = provider_env(providers.tls, NO_PROXY="example.org, localhost")
        async with gateway_process(config, env) as gateway:
            answer = await gateway.notify(every_device(providers.webpush.subscribe()))
            assert answer.status_code == 200, gateway.output()
            assert_delivered_once_each(providers, answer.json())
            ports = providers.ports()
            assert [proxy.tunnels_to(ports[name]) for name in ("apns", "fcm", "webpush")] == [1, 2, 0]
        # `*` sends everything direct.
        env = provider_env(providers.tls, NO_PROXY="*")
        async with gateway_process(config, env) as gateway:
            answer = await gateway.notify(every_device(providers.webpush.subscribe()))
            assert answer.status_code == 200, gateway.output()
            assert len(proxy.tunnels) == 3


@pytest.mark.parametrize(
    ("refusal", "said"), [("502", "answered 502 to CONNECT"), ("credentials", "answered 407 to CONNECT")]
)
async def test_a_refusing_proxy_is_a_transient_failure_told_in_one_line(
    tmp_path: Path, providers: Providers, refusal: str, said: str
) -> None:
    options = {"refuse_with": 502} if refusal == "502" else {"credentials": (USER, PASSWORD)}
    async with ConnectProxy(**options) as proxy:  # type: ignore[arg-type]
        url = proxy.url if refusal == "502" else proxy.url.replace(PASSWORD, "wrong-word")
        config = gateway_config(tmp_path, providers, proxy=url)
        # Retried within the request until its deadline: a short one keeps the test short.
        env = provider_env(providers.tls, XMTP_PUSH_MATRIX_REQUEST_TIMEOUT_SECONDS="2")
        async with gateway_process(config, env) as gateway:
            answer = await gateway.notify(every_device(providers.webpush.subscribe()))
            again = await gateway.notify(every_device(providers.webpush.subscribe()))
            # Not the tokens' fault: nothing rejected, the homeserver retries later.
            assert (answer.status_code, again.status_code) == (502, 502), gateway.output()
            assert proxy.tunnels == [] and len(proxy.refused) >= 3
            assert providers.apns.requests == [] and providers.webpush.all_pushes() == []
            output = gateway.output()
            told = [
                line for line in output.splitlines() if f"the egress proxy 127.0.0.1:{proxy.port}" in line
            ]
            assert len(told) == 1 and said in told[0], output
            assert "Traceback" not in output
            assert PASSWORD not in output and "wrong-word" not in output


async def test_fcm_alone_behind_a_refusing_proxy_is_told_in_one_line_too(
    tmp_path: Path, providers: Providers
) -> None:
    """firebase-admin's httpx and google-auth's requests raise their own proxy errors: the same line."""
    async with ConnectProxy(refuse_with=502) as proxy:
        config = gateway_config(tmp_path, providers, only="org.android", proxy=proxy.url)
        env = provider_env(providers.tls, XMTP_PUSH_MATRIX_REQUEST_TIMEOUT_SECONDS="2")
        async with gateway_process(config, env) as gateway:
            answer = await gateway.notify(event_id_only(device("org.android", "ok.1")))
            assert answer.status_code == 502, gateway.output()
            assert proxy.tunnels == [] and proxy.refused != []
            assert providers.fcm.requests == [] and providers.fcm.token_requests == []
            output = gateway.output()
            told = [line for line in output.splitlines() if "the egress proxy" in line]
            assert len(told) == 1 and f"127.0.0.1:{proxy.port} answered 502 to CONNECT" in told[0], output
            assert "Traceback" not in output


async def test_webhooks_go_direct_unless_their_own_proxy_is_set_and_then_stay_pinned(
    postgresql_url: str, tls: TlsFiles, apns_server: FakeApns
) -> None:
    apns_server.reset()
    async with Receiver(tls=tls, name="localhost") as receiver, ConnectProxy() as proxy:
        endpoint = receiver.endpoint([200])
        async with running(make_settings(postgresql_url)) as api:
            hook = await register(api.stub, "http", endpoint.url, endpoint.key)
            device = await register(api.stub, "apns", f"ok.{secrets.token_hex(16)}")
        env = channel_env(postgresql_url, apns_endpoint=apns_server.endpoint, apns_ca_file=tls.ca_file)
        env = provider_env(tls) | {k: v for k, v in env.items() if k.startswith("XMTP_PUSH_")}
        # HTTPS_PROXY is for provider traffic: APNs goes through it, the receiver's post does not.
        results = [
            await xmtp_push("send-test", recipient.rid.hex(), env=env | {"HTTPS_PROXY": proxy.url})
            for recipient in (hook, device)
        ]
        for result in results:
            assert result.returncode == 0 and "delivered" in result.stdout, result
        assert proxy.tunnels == [f"127.0.0.1:{apns_server.port}"]
        # XMTP_PUSH_WEBHOOK_PROXY carries webhooks, to the address the URL policy checked for the
        # name (the receiver's URL says localhost; its certificate is verified for it).
        proxied = await xmtp_push(
            "send-test", hook.rid.hex(), env=env | {"XMTP_PUSH_WEBHOOK_PROXY": proxy.url}
        )
        assert proxied.returncode == 0 and "delivered" in proxied.stdout, proxied
        assert proxy.tunnels == [f"127.0.0.1:{apns_server.port}", f"127.0.0.1:{receiver.port}"]
        assert len(endpoint.requests) == 2 and receiver.failures == []
        assert len(apns_server.requests) == 1
