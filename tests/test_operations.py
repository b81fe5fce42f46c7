"""What an operator relies on (docs/operations.md): the compose file, the reverse-proxy example, the
Prometheus metrics after a scripted run, and the operator commands `send-test`, `stats` and
`config check` run as real child processes of the console script.

Nothing of ours is patched: the API, workers, queue (Redis DB 9) and database (PostgreSQL) run for
real; the remote ends are local stand-ins (a Standard Webhooks verifying receiver, fakes/fake_apns.py
and fakes/fake_fcm.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.core.config import Settings
from app.legacy.models import LegacyInstallation, LegacySubscription
from app.ops.stats import collect_stats
from app.proto.notifications.v1 import service_pb2 as lpb
from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.queue.activity import NODE_GO, ListenerState
from app.recipients.models import Recipient
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.keys import apns_key_pem, fcm_key
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Receiver
from tests.support import make_settings, running
from tests.support import pipeline as pipeline_support
from tests.support.legacy import SERVICE as LEGACY
from tests.support.legacy import register_request
from tests.support.ops import (
    ENV_EXAMPLE,
    ROOT,
    Registered,
    channel_env,
    child_env,
    compose_config,
    example_env,
    free_port,
    register,
    required_tool,
    run_child,
    scripted_run,
    xmtp_push,
)
from tests.support.pipeline import (
    REDIS_TEST_URL,
    envelope,
    group_topic,
    metric,
    parse_metrics,
    running_pipeline,
    wait_until,
)

# Fixtures from the helper module, bound here so pytest finds them.
redis_url = pipeline_support.redis_url
redis_postgresql_stack = pipeline_support.redis_postgresql_stack

COMPOSE_FILE = ROOT / "docker-compose.yml"
NGINX_EXAMPLE = ROOT / "nginx.conf.example"
PROGRESS = ("... looking up the recipient", "... sending a test hint over")


# --- the compose file ------------------------------------------------------------------------------


def published(port: str | dict[str, Any]) -> tuple[str, int, int]:
    """(host address, host port, container port) of a `ports` entry, short or long syntax."""
    if isinstance(port, dict):
        return str(port.get("host_ip", "0.0.0.0")), int(port["published"]), int(port["target"])
    host, published_port, target = port.split("/")[0].rsplit(":", 2)
    return host, int(published_port), int(target)


@pytest.mark.tools("docker-compose")
def test_compose_file_is_valid_and_has_the_production_shape(tmp_path: Path) -> None:
    code, config, output = compose_config(tmp_path, example_env())
    assert code == 0, output
    services: dict[str, Any] = config["services"]
    workers = sorted(name for name, s in services.items() if s.get("command") == ["worker"])
    assert {"postgres", "redis", "migrate", "api", "listener"} <= set(services)
    assert len(workers) == 2, workers
    commands = {name: s.get("command") for name, s in services.items() if "build" in s}
    assert commands == {
        "migrate": ["migrate"],
        "api": ["api"],
        "listener": ["listen"],
        **{name: ["worker"] for name in workers},
    }
    # Migrations run once, before anything that uses the database.
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "listener", *workers):
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        assert services[name]["restart"] == "unless-stopped", name
    for name in commands:
        env = services[name]["environment"]
        assert (
            env["XMTP_PUSH_DATABASE_URL"] == "postgresql+asyncpg://xmtp_push:pw-0f5e@postgres:5432/xmtp_push"
        )
        assert env["XMTP_PUSH_REDIS_URL"] == "redis://redis:6379/0", name
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw-0f5e"
    # Health checks: the databases, and the API's readiness (which covers both of them).
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "ping" in services["redis"]["healthcheck"]["test"]
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    assert sorted(published(p) for p in services["api"]["ports"]) == [
        ("127.0.0.1", 8080, 8080),
        ("127.0.0.1", 50051, 50051),
    ]
    # The network the listener joins is named in .env.example, which the compose file points to.
    listener_env = services["listener"]["environment"]
    assert listener_env["XMTP_PUSH_XMTPD_ADDRESS"] == "grpc.testnet.xmtp.network:443"
    assert "XMTP testnet" in COMPOSE_FILE.read_text() and "XMTP testnet" in ENV_EXAMPLE.read_text()


@pytest.mark.tools("docker-compose")
def test_compose_file_passes_every_setting_of_the_env_file(tmp_path: Path) -> None:
    settings = {
        "XMTP_PUSH_PROVIDER_TIMEOUT_SECONDS": "4",
        "XMTP_PUSH_DELIVERY_CONCURRENCY": "64",
        "XMTP_PUSH_XMTPD_ADDRESS": "xmtpd.internal:5050",
        "XMTP_PUSH_XMTPD_TLS": "false",
    }
    code, config, output = compose_config(tmp_path, example_env(**settings))
    assert code == 0, output
    built = {name: s for name, s in config["services"].items() if "build" in s}
    assert len(built) == 5, sorted(built)
    for name, service in built.items():
        assert settings.items() <= service["environment"].items(), name


def test_env_example_names_only_settings() -> None:
    names = re.findall(r"^#? ?(XMTP_PUSH_[A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.MULTILINE)
    assert len(names) > 10, names
    unknown = [name for name in names if name.removeprefix("XMTP_PUSH_").lower() not in Settings.model_fields]
    assert not unknown, unknown


@pytest.mark.tools("docker-compose")
def test_compose_file_refuses_to_start_without_a_database_password(tmp_path: Path) -> None:
    no_password = ENV_EXAMPLE.read_text()
    assert "\nPOSTGRES_PASSWORD=\n" in no_password  # the example ships none
    code, _, output = compose_config(tmp_path / "empty", no_password)
    assert code != 0 and "set POSTGRES_PASSWORD in .env" in output, output
    code, _, output = compose_config(tmp_path / "missing", None)
    assert code != 0 and "POSTGRES_PASSWORD" in output, output
    raw = COMPOSE_FILE.read_text()
    assert "POSTGRES_PASSWORD:-" not in raw and "POSTGRES_PASSWORD-" not in raw  # no default anywhere


# --- the reverse-proxy example ---------------------------------------------------------------------


def nginx_config(folder: Path, tls: TlsFiles, listen: int, http_port: int, grpc_port: int) -> Path:
    """nginx.conf.example as it is, but for this machine: certificate, upstream ports, a free port."""
    text = NGINX_EXAMPLE.read_text()
    replacements = {
        "server api:50051;": f"server 127.0.0.1:{grpc_port};",
        "server api:8080;": f"server 127.0.0.1:{http_port};",
        "listen 443 ssl http2;": f"listen 127.0.0.1:{listen} ssl http2;",
        "/etc/nginx/certs/fullchain.pem": tls.cert_file,
        "/etc/nginx/certs/privkey.pem": tls.key_file,
        "events {}": f"pid {folder}/nginx.pid;\nerror_log {folder}/error.log;\nevents {{}}",
        "\nhttp {": (
            f"\nhttp {{\n    access_log off;\n    client_body_temp_path {folder}/body;\n"
            f"    proxy_temp_path {folder}/proxy;\n    fastcgi_temp_path {folder}/fastcgi;\n"
            f"    uwsgi_temp_path {folder}/uwsgi;\n    scgi_temp_path {folder}/scgi;"
        ),
    }
    for old, new in replacements.items():
        assert text.count(old) == 1, f"nginx.conf.example no longer has {old!r}"
        text = text.replace(old, new)
    path = folder / "nginx.conf"
    path.write_text(text)
    return path


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


@asynccontextmanager
async def running_nginx(config: Path, port: int) -> AsyncIterator[None]:
    nginx = required_tool("nginx", "nginx-light")
    checked = await run_child([nginx, "-t", "-c", str(config), "-p", str(config.parent)], child_env())
    assert checked.returncode == 0, checked
    process = await asyncio.create_subprocess_exec(
        nginx, "-c", str(config), "-p", str(config.parent), "-g", "daemon off;",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                assert process.returncode is None, "nginx exited"
                assert time.monotonic() < deadline, "nginx did not listen within 10 s"
                await asyncio.sleep(0.05)
        yield
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.mark.tools("nginx")
async def test_nginx_example_routes_grpc_and_connect(
    postgresql_url: str, tls: TlsFiles, tmp_path: Path
) -> None:
    async with running(make_settings(postgresql_url)) as api:
        port = free_port()
        config = nginx_config(tmp_path, tls, port, api.http_port, api.grpc_port)
        async with running_nginx(config, port):
            # gRPC, as the SDK calls it: TLS and HTTP/2 to the proxy, on to the gRPC port.
            credentials = grpc.ssl_channel_credentials(read_bytes(tls.ca_file))
            async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
                stub = notification_pb2_grpc.NotificationServiceStub(channel)
                through_grpc = await register(stub, "http", "http://127.0.0.1:9/hook", b"k" * 32)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Unregister(
                        pb.UnregisterRequest(recipient_id=through_grpc.rid, recipient_secret=b"x" * 32),
                        timeout=10,
                    )
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # The same path over the Connect protocol goes to the HTTP port.
            rid = secrets.token_bytes(32)
            body = {
                "recipientId": base64.b64encode(rid).decode(),
                "recipientSecret": base64.b64encode(secrets.token_bytes(32)).decode(),
                "http": {
                    "url": "http://127.0.0.1:9/hook",
                    "signingKey": base64.b64encode(b"k" * 32).decode(),
                },
            }
            verify = ssl.create_default_context(cafile=tls.ca_file)
            async with httpx.AsyncClient(base_url=f"https://localhost:{port}", verify=verify) as client:
                answer = await client.post("/xmtp.backend.v1.NotificationService/Register", json=body)
                assert answer.status_code == 200, answer.text
                assert answer.json()["channel"] == "CHANNEL_HTTP"
                assert (await client.get("/readyz")).json()["status"] == "ok"
                assert (await client.get("/metrics")).status_code == 200  # from 127.0.0.1: allowed
        async with api.runtime.sessions() as session:
            assert await session.get(Recipient, through_grpc.rid) is not None
            assert await session.get(Recipient, rid) is not None


@pytest.mark.tools("nginx")
async def test_nginx_example_gives_both_platforms_of_the_legacy_api_one_address(
    postgresql_url: str, tls: TlsFiles, tmp_path: Path
) -> None:
    """docs/switching.md#one-address-for-both-platforms: Android's gRPC and iOS's Connect proto (and
    Connect JSON) reach the legacy API through the one address of the example."""
    async with running(make_settings(postgresql_url, legacy_api_enabled=True)) as api:
        port = free_port()
        config = nginx_config(tmp_path, tls, port, api.http_port, api.grpc_port)
        async with running_nginx(config, port):
            android = register_request("android", firebase_device_token="f" * 40)
            credentials = grpc.ssl_channel_credentials(read_bytes(tls.ca_file))
            async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
                rpc = channel.unary_unary(
                    f"/{LEGACY}/RegisterInstallation",
                    request_serializer=lambda b: b,
                    response_deserializer=lpb.RegisterInstallationResponse.FromString,
                )
                answer = await rpc(android.SerializeToString(), timeout=10)
                assert answer.installation_id == "android" and answer.valid_until > 0
            ios = register_request("ios", apns_device_token="a" * 64)
            verify = ssl.create_default_context(cafile=tls.ca_file)
            async with httpx.AsyncClient(base_url=f"https://localhost:{port}", verify=verify) as client:
                path = f"/{LEGACY}/RegisterInstallation"
                headers = {"content-type": "application/proto"}
                reply = await client.post(path, content=ios.SerializeToString(), headers=headers)
                assert reply.status_code == 200, reply.text
                assert reply.headers["content-type"] == "application/proto"
                assert lpb.RegisterInstallationResponse.FromString(reply.content).installation_id == "ios"
                topics = {"installationId": "ios", "topics": ["/xmtp/mls/1/g-" + "0" * 32 + "/proto"]}
                subscribed = await client.post(f"/{LEGACY}/Subscribe", json=topics)
                assert (subscribed.status_code, subscribed.json()) == (200, {})
        async with api.runtime.sessions() as session:
            stored = {i.id: i.kind for i in (await session.scalars(select(LegacyInstallation))).all()}
            subscriptions = (await session.scalars(select(LegacySubscription))).all()
        assert stored == {"android": 2, "ios": 1}  # fcm, apns
        assert [s.installation_id for s in subscriptions] == ["ios"]


# --- metrics after a scripted run ------------------------------------------------------------------

COUNTERS = {
    "xmtp_push_deliveries": {"channel", "outcome"},
    "xmtp_push_recipients": {"action"},
    "xmtp_push_subscriptions": {"action"},
    "xmtp_push_envelopes": {"result"},
}
HISTOGRAMS = {"xmtp_push_delivery_seconds": {"channel"}, "xmtp_push_rpc_seconds": {"method", "code"}}
GAUGES = {"xmtp_push_queue_depth": {"queue"}, "xmtp_push_inflight": {"channel"}}


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """Family name -> (type, label names seen on its samples, without `le`)."""
    found = {}
    for family in text_string_to_metric_families(text):
        labels = {name for sample in family.samples for name in sample.labels} - {"le"}
        found[family.name] = (family.type, labels)
    return found


async def test_metrics_names_types_and_values_after_a_scripted_run(
    redis_postgresql_stack: pipeline_support.Stack, receiver: Receiver
) -> None:
    async with running_pipeline(redis_postgresql_stack) as pipe:
        before = parse_metrics(await pipe.metrics_text())
        topic, quiet_topic = group_topic(), group_topic()
        ok, gone = receiver.endpoint([200]), receiver.endpoint([410])
        delivered = await pipe.member(ok, topic)
        dead = await pipe.member(gone, topic, quiet_topic)
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a signing key of 4 bytes
            await pipe.stub.Register(
                pb.RegisterRequest(
                    recipient_id=secrets.token_bytes(32),
                    recipient_secret=secrets.token_bytes(32),
                    http=pb.HttpDelivery(url=ok.url, signing_key=b"kkkk"),
                ),
                timeout=10,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await pipe.ingest_ok([envelope(topic, 7), envelope(quiet_topic, 8, should_push=False)])
        await wait_until(lambda: len(gone.requests) == 3, 15, "three attempts at the 410 webhook")
        await pipe.settled(receiver)
        assert await pipe.recipient(dead.rid) is None
        assert ok.hints() == [(topic, 7, delivered.rid)]

        # Gauges are sampled every few seconds; wait for a sample of the now empty queues.
        async def sampled() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
            deadline = time.monotonic() + 8
            while True:
                samples = parse_metrics(await pipe.metrics_text())
                depths = [v for (name, _), v in samples.items() if name == "xmtp_push_queue_depth"]
                if depths and not any(depths):
                    return samples
                assert time.monotonic() < deadline, f"queue depth gauges still {depths}"
                await asyncio.sleep(0.2)

        after = await sampled()
        text = await pipe.metrics_text()

    found = families(text)
    for expected, kind in ((COUNTERS, "counter"), (HISTOGRAMS, "histogram"), (GAUGES, "gauge")):
        for name, labels in expected.items():
            assert name in found, f"{name} is not exported"
            assert found[name] == (kind, labels), (name, found[name])

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("xmtp_push_recipients_total", action="registered") == 2
    assert delta("xmtp_push_recipients_total", action="dead") == 1
    assert delta("xmtp_push_recipients_total", action="unregistered") == 0
    assert delta("xmtp_push_subscriptions_total", action="added") == 3
    assert delta("xmtp_push_subscriptions_total", action="removed") == 0
    assert delta("xmtp_push_envelopes_total", result="ingested") == 2
    assert delta("xmtp_push_envelopes_total", result="fanned_out") == 1
    assert delta("xmtp_push_envelopes_total", result="ineligible") == 1
    outcomes = {"delivered": 1, "dead": 1, "failed": 0, "rejected": 0, "mismatch": 0, "suppressed": 0}
    for outcome, count in outcomes.items():
        assert delta("xmtp_push_deliveries_total", channel="http", outcome=outcome) == count, outcome
    # One attempt at the 200 webhook, three at the 410 one.
    assert delta("xmtp_push_delivery_seconds_count", channel="http") == 4
    assert delta("xmtp_push_rpc_seconds_count", method="Register", code="ok") == 2
    assert delta("xmtp_push_rpc_seconds_count", method="Register", code="invalid_argument") == 1
    assert delta("xmtp_push_rpc_seconds_count", method="UpdateSubscriptions", code="ok") == 3
    assert metric(after, "xmtp_push_inflight", channel="http") == 0
    queues = {dict(labels)["queue"] for name, labels in after if name == "xmtp_push_queue_depth"}
    assert {"envelopes", "deliveries.http", "retries"} <= queues
    # No label carries an id, URL, key or topic. (Labels only: a port's digits may well turn up in a
    # sample's value, a byte count say.)
    labels = " ".join(
        f"{name}={value}"
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for name, value in sample.labels.items()
    )
    for value in (delivered.rid.hex(), dead.rid.hex(), ok.url, str(receiver.port), topic.hex()):
        assert value not in labels
    for value in (delivered.rid.hex(), dead.rid.hex(), ok.url, topic.hex()):
        assert value not in text
    assert base64.b64encode(topic).decode() not in text


# --- send-test -------------------------------------------------------------------------------------

DURATION = re.compile(r"^(apns|fcm|http): (\w+) in \d+ ms(?:: .+)?$", re.MULTILINE)


async def test_send_test_sends_through_each_channel_and_changes_nothing(
    postgresql_url: str, receiver: Receiver, apns_server: FakeApns, fcm_server: FakeFcm, tls: TlsFiles
) -> None:
    endpoints = {"ok": receiver.endpoint([200]), "gone": receiver.endpoint([410])}
    settings = make_settings(postgresql_url)
    async with running(settings) as api:
        webhook_ok = await register(api.stub, "http", endpoints["ok"].url, endpoints["ok"].key)
        webhook_gone = await register(api.stub, "http", endpoints["gone"].url, endpoints["gone"].key)
        apns_ok = await register(api.stub, "apns", f"ok.{secrets.token_hex(16)}")
        fcm_gone = await register(api.stub, "fcm", f"gone.{secrets.token_hex(16)}")
        env = channel_env(
            postgresql_url,
            apns_endpoint=apns_server.endpoint,
            apns_ca_file=tls.ca_file,
            fcm_endpoint=fcm_server.endpoint,
            fcm_token_uri=fcm_server.token_uri,
        )
        webhooks_only = channel_env(postgresql_url)
        cases: list[tuple[Registered, dict[str, str], str, int]] = [
            (webhook_ok, env, "delivered", 0),
            (webhook_gone, env, "dead", 1),
            (apns_ok, env, "delivered", 0),
            (fcm_gone, env, "dead", 1),
        ]
        unknown = secrets.token_bytes(32)
        results = await asyncio.gather(
            *(xmtp_push("send-test", r.rid.hex(), env=e) for r, e, _, _ in cases),
            xmtp_push("send-test", unknown.hex(), env=env),
            xmtp_push("send-test", apns_ok.rid.hex(), env=webhooks_only),
        )
        for (recipient, _, outcome, code), result in zip(cases, results, strict=False):
            assert result.returncode == code, result
            assert DURATION.findall(result.stdout) == [(recipient.channel, outcome)], result
            for step in PROGRESS:
                assert step in result.stderr, result
            for secret in (recipient.target, recipient.rid.hex(), recipient.secret.hex()):
                assert secret not in result.stdout + result.stderr, result
        not_registered, not_configured = results[len(cases) :]
        assert not_registered.returncode == 1, not_registered
        assert "recipient is not registered" in not_registered.stderr
        assert not_configured.returncode == 1, not_configured
        assert "channel apns is not configured here" in not_configured.stderr

        # Each remote end got exactly the one test hint, for the recipient; nothing was deleted.
        test_topic = b"\x00" * 17
        assert endpoints["ok"].hints() == [(test_topic, 0, webhook_ok.rid)]
        assert endpoints["gone"].hints() == [(test_topic, 0, webhook_gone.rid)]
        assert len(apns_server.requests_for(apns_ok.target)) == 1
        assert len(fcm_server.requests_for(fcm_gone.target)) == 1
        async with api.runtime.sessions() as session:
            for recipient, *_ in cases:
                assert await session.get(Recipient, recipient.rid) is not None, recipient.channel


# --- stats -----------------------------------------------------------------------------------------


@pytest.mark.redis
async def test_stats_after_a_scripted_run(
    redis_postgresql_stack: pipeline_support.Stack, receiver: Receiver, apns_server: FakeApns, tls: TlsFiles
) -> None:
    overrides = {
        "apns_key": apns_key_pem(),
        "apns_endpoint": apns_server.endpoint,
        "apns_ca_file": tls.ca_file,
    }
    apns_server.reset()
    async with running_pipeline(redis_postgresql_stack, **overrides) as pipe:
        run = await scripted_run(pipe, receiver, apns_server)
        env = channel_env(
            redis_postgresql_stack.database_url,
            apns_endpoint=apns_server.endpoint,
            apns_ca_file=tls.ca_file,
            redis_url=REDIS_TEST_URL,
        )
        text, as_json = await asyncio.gather(
            xmtp_push("stats", env=env), xmtp_push("stats", "--json", env=env)
        )
    assert text.returncode == 0, text
    assert as_json.returncode == 0, as_json
    document = json.loads(as_json.stdout)
    assert document["recipients"] == run.recipients
    assert document["subscriptions"] == run.subscriptions
    assert document["outcomes"] == run.outcomes
    assert document["queue_depths"] == {
        "envelopes": 0,
        "deliveries.apns": 0,
        "deliveries.fcm": 0,
        "deliveries.http": 0,
    }
    assert document["retries_waiting"] == 0
    lines = text.stdout.splitlines()
    expected = [
        "recipients:",
        "  apns   1",
        "  fcm    0",
        "  http   2",
        "subscriptions: 3",
        "queue depths:",
        "  envelopes          0",
        "  deliveries.apns    0",
        "  deliveries.fcm     0",
        "  deliveries.http    0",
        "  retries waiting    0",
        "delivery outcomes, last hour:",
        "  apns   dead 1, delivered 1",
        "  http   dead 1, delivered 2",
        "credentials refused, last hour:",
        "  none",
    ]
    assert lines[: len(expected)] == expected, text.stdout


async def test_stats_tell_refused_credentials_and_the_listener(
    redis_postgresql_stack: pipeline_support.Stack, apns_server: FakeApns, tls: TlsFiles
) -> None:
    overrides = {
        "apns_key": apns_key_pem(),
        "apns_endpoint": apns_server.endpoint,
        "apns_ca_file": tls.ca_file,
    }
    apns_server.reset()
    async with running_pipeline(redis_postgresql_stack, **overrides) as pipe:
        topic = group_topic()
        await register(pipe.stub, "apns", f"forbidden.{secrets.token_hex(16)}", topics=[topic])
        await pipe.ingest_ok([envelope(topic, 7)])
        refused = 0
        deadline = time.monotonic() + 20
        while not refused:  # the worker saw APNs refuse the credentials and recorded it beside the queue
            assert time.monotonic() < deadline, "no credential refusal recorded"
            pipe.check_workers()
            refused = (await collect_stats(pipe.runtime)).credentials_refused.get("apns", 0)
            await asyncio.sleep(0.05)
        await pipe.stop_workers()  # no more attempts: the count stands still
        refused = (await collect_stats(pipe.runtime)).credentials_refused["apns"]
        env = channel_env(redis_postgresql_stack.database_url, redis_url=REDIS_TEST_URL)
        before = await xmtp_push("stats", env=env)
        activity = pipe.runtime.activity
        assert activity is not None
        # What the listener leaves as it ends cleanly (tests/test_listener.py runs one to its stop).
        await activity.set_listener(ListenerState(0.5, time.time() - 300, "stopped", 0))
        # And a node-go listener's, once one has reported (a legacy API deployment's).
        await activity.set_listener(ListenerState(0.0, time.time() - 60, "stopped"), NODE_GO)
        after = await xmtp_push("stats", env=env)
    assert before.returncode == after.returncode == 0, (before, after)
    tail = ["credentials refused, last hour:", f"  apns   {refused}"]
    assert before.stdout.splitlines()[-3:] == [
        *tail,
        "listener: not configured: no listener has reported (run `xmtp-push listen`)",
    ], before.stdout
    assert after.stdout.splitlines()[-4:-2] == tail
    assert re.fullmatch(r"listener: stopped 30\d s ago \(a clean stop\)", after.stdout.splitlines()[-2])
    assert re.fullmatch(
        r"node-go listener: stopped 6\d s ago \(a clean stop\)", after.stdout.splitlines()[-1]
    )


async def test_stats_without_a_queue_says_so(postgresql_url: str) -> None:
    result = await xmtp_push("stats", env=channel_env(postgresql_url))
    assert result.returncode == 0, result
    assert "queues: none configured (XMTP_PUSH_REDIS_URL unset)" in result.stdout


# --- config check ----------------------------------------------------------------------------------


MARMOT_KEY = secrets.token_bytes(32).hex()


def check_lines(output: str) -> dict[str, str]:
    """`ok  <name> <detail>` / `FAIL <name> <detail>` lines as name -> status."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"^(ok  |FAIL) (.{14}) ", line)
        if match:
            found[match.group(2).strip()] = match.group(1).strip()
    return found


@pytest.mark.redis
async def test_config_check(
    postgresql_url: str, tmp_path: Path, apns_server: FakeApns, fcm_server: FakeFcm
) -> None:
    good = channel_env(
        postgresql_url,
        apns_endpoint=apns_server.endpoint,
        fcm_endpoint=fcm_server.endpoint,
        fcm_token_uri=fcm_server.token_uri,
        redis_url=REDIS_TEST_URL,
        marmot_secret_key=MARMOT_KEY,
        marmot_relays="wss://relay.example",
    )
    garbage = base64.b64encode(secrets.token_bytes(48)).decode()
    not_a_key = f"-----BEGIN PRIVATE KEY-----\n{garbage}\n-----END PRIVATE KEY-----\n"
    rsa_key = (
        fcm_key()
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        .decode()
    )
    bad_key, wrong_key = dict(good), dict(good)
    bad_key["XMTP_PUSH_APNS_KEY"] = not_a_key
    wrong_key["XMTP_PUSH_APNS_KEY"] = rsa_key
    # An unmigrated database and a Redis nobody listens on, in one run: a line for each.
    unusable = dict(
        good,
        XMTP_PUSH_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}",
        XMTP_PUSH_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    ok, bad, wrong, broken = await asyncio.gather(
        *(xmtp_push("config", "check", env=e) for e in (good, bad_key, wrong_key, unusable))
    )

    assert ok.returncode == 0, ok
    assert check_lines(ok.stdout) == {
        "channel apns": "ok",
        "channel fcm": "ok",
        "channel http": "ok",
        "marmot": "ok",
        "database": "ok",
        "redis": "ok",
    }, ok
    assert "configuration is usable" in ok.stdout
    assert "ok   marmot         key set, 1 relay(s), pushes through apns, fcm\n" in ok.stdout
    assert MARMOT_KEY not in ok.stdout + ok.stderr

    for result, secret in ((bad, garbage), (wrong, rsa_key.splitlines()[1])):
        assert result.returncode == 2, result  # an invalid setting (docs/configuration.md, "Exit codes")
        assert check_lines(result.stdout)["channel apns"] == "FAIL", result
        line = next(x for x in result.stdout.splitlines() if x.startswith("FAIL channel apns"))
        assert "XMTP_PUSH_APNS_KEY" in line
        assert secret not in result.stdout + result.stderr
        assert "BEGIN" not in result.stdout + result.stderr
        assert "1 check(s) failed" in result.stdout

    assert broken.returncode == 7, broken  # the first failure's: not migrated
    assert check_lines(broken.stdout) == {
        "channel apns": "ok",
        "channel fcm": "ok",
        "channel http": "ok",
        "marmot": "ok",
        "database": "FAIL",
        "redis": "FAIL",
    }, broken
    assert "run `xmtp-push migrate`" in broken.stdout
    assert "2 check(s) failed" in broken.stdout
