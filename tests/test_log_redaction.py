"""Logs are JSON lines and never carry a recipient id, secret, signing key, device token, webhook URL,
topic or token (docs/operations.md#logs), at DEBUG level, on every path a scripted run reaches.

`xmtp-push dev` runs as a child process on a PostgreSQL database of its own, with the webhook channel
and APNs and FCM configured against local stand-ins (fakes/fake_apns.py, fakes/fake_fcm.py).
The run registers (accepted and refused, over gRPC and Connect), subscribes, ingests (valid, malformed,
with a wrong token), delivers to webhooks answering 200, 404, 410 and 500 and to one that does not
listen, to APNs and FCM tokens answering 200, gone and 500, and breaks the database connections under
the API.
Then every line of its stderr is checked.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from fakes import keys
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import ACCESS_TOKEN, FakeFcm
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Endpoint, Receiver
from tests.support import create_postgres_database, drop_postgres_database
from tests.support.ops import Registered, channel_env, command, free_port, register
from tests.support.pipeline import envelope, group_topic, server_envelope, wait_until, welcome_topic

START_SECONDS = 60.0
STOP_SECONDS = 20.0
MAX_ATTEMPTS = 2


def forms(value: bytes) -> list[str]:
    """The ways bytes show up in text: hex (both cases), base64 and URL-safe base64, padded or not,
    and Python's repr (a driver quoting its parameters)."""
    std = base64.b64encode(value).decode()
    url = base64.urlsafe_b64encode(value).decode()
    return [value.hex(), value.hex().upper(), std, std.rstrip("="), url, url.rstrip("="), repr(value)[2:-1]]


def strings(value: Any) -> Iterator[str]:
    """Every string inside a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def leaks(lines: Iterable[str], secrets_: dict[str, str]) -> list[str]:
    """Each line as written and with its JSON strings decoded (a repr's backslashes are escaped)."""
    found = []
    for line in lines:
        try:
            texts = [line, *strings(json.loads(line))]
        except ValueError:
            texts = [line]
        found += [f"{what} in: {line[:300]}" for what, s in secrets_.items() if any(s in t for t in texts)]
    return found


class Flow:
    """The scripted run against one `xmtp-push dev`; collects every value that must not be logged."""

    def __init__(self, stub: notification_pb2_grpc.NotificationServiceStub, http: httpx.AsyncClient) -> None:
        self.stub = stub
        self.http = http
        self.forbidden: dict[str, str] = {}

    def forbid(self, name: str, value: bytes | str) -> None:
        if isinstance(value, str):
            self.forbidden[name] = value
            return
        for n, form in enumerate(forms(value)):
            self.forbidden[f"{name} ({n})"] = form

    def forbid_recipient(self, name: str, recipient: Registered) -> None:
        self.forbid(f"{name} id", recipient.rid)
        self.forbid(f"{name} secret", recipient.secret)
        self.forbid(f"{name} secret hash", hashlib.sha256(recipient.secret).digest())
        self.forbid(f"{name} target", recipient.target)
        if recipient.signing_key:
            self.forbid(f"{name} signing key", recipient.signing_key)

    async def recipient(
        self, name: str, channel: str, target: str, key: bytes, topics: list[bytes]
    ) -> Registered:
        recipient = await register(self.stub, channel, target, key, topics)
        self.forbid_recipient(name, recipient)
        return recipient

    async def refused(self, name: str, code: grpc.StatusCode, request: Any, method: str = "Register") -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await getattr(self.stub, method)(request, timeout=10)
        assert raised.value.code() == code, (name, raised.value.code())


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text()[-chars:]


async def wait_healthy(process: asyncio.subprocess.Process, port: int, stderr: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            assert process.returncode is None, f"xmtp-push dev exited:\n{tail(stderr)}"
            try:
                if (await client.get(f"http://127.0.0.1:{port}/healthz", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"xmtp-push dev did not answer within {START_SECONDS} s")


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.postgres
async def test_dev_logs_json_lines_without_secrets(
    database: str,
    receiver: Receiver,
    apns_server: FakeApns,
    fcm_server: FakeFcm,
    tls: TlsFiles,
    tmp_path: Path,
) -> None:
    # `dev` migrates its database first: a fresh one of its own.
    if database == "sqlite":
        database_url = f"sqlite+aiosqlite:///{tmp_path / 'dev.db'}"
    else:
        database_url = await create_postgres_database()
    http_port, grpc_port = free_port(), free_port()
    ingest_token = f"ingest-{secrets.token_hex(12)}"
    env = channel_env(
        database_url,
        apns_endpoint=apns_server.endpoint,
        apns_ca_file=tls.ca_file,
        fcm_endpoint=fcm_server.endpoint,
        fcm_token_uri=fcm_server.token_uri,
        http_host="127.0.0.1",
        http_port=str(http_port),
        grpc_host="127.0.0.1",
        grpc_port=str(grpc_port),
        log_level="DEBUG",
        ingest_token=ingest_token,
        max_attempts=str(MAX_ATTEMPTS),
        retry_base_seconds="0.05",
    )
    stderr_path, stdout_path = tmp_path / "stderr.log", tmp_path / "stdout.log"
    with stderr_path.open("wb") as stderr, stdout_path.open("wb") as stdout:
        process = await asyncio.create_subprocess_exec(
            *command(),
            "dev",
            env=env,
            cwd=tmp_path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        await wait_healthy(process, http_port, stderr_path)
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http,
        ):
            flow = Flow(notification_pb2_grpc.NotificationServiceStub(channel), http)
            endpoints = await scripted_flow(
                flow, receiver, apns_server, fcm_server, database_url, ingest_token
            )
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), STOP_SECONDS)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if database == "postgresql":
            await drop_postgres_database(database_url)
    output = stderr_path.read_text()
    assert code == 0, output[-3000:]

    # Every line is one JSON object.
    lines = [line for line in output.splitlines() if line.strip()]
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line[:300]}")
        assert isinstance(event, dict), line
        events.append(event)

    # The run reached the paths it meant to: deliveries, refusals, failures, the database breaking.
    levels = {e["level"] for e in events}
    assert {"debug", "info", "warning"} <= levels, levels
    messages = [str(e["event"]) for e in events]
    expected = [
        "http attempt delivered",
        "http attempt dead",
        "http attempt failed",
        "apns attempt delivered",
        "apns attempt dead",
        "apns attempt failed",
        "fcm attempt delivered",
        "fcm attempt dead",
        "fcm attempt failed",
        "Register answered invalid_argument",
        "Unregister answered permission_denied",
        "UpdateSubscriptions answered not_found",
        "ingest refused: bearer token",
        "ingest refused: envelopes[0].topic",
        "ingest refused: envelopes[0].sequence_id",
    ]
    if database == "postgresql":
        expected += ["Register answered unavailable", "XMTP_PUSH_DATABASE_URL: the database"]
    missing = [m for m in expected if not any(message.startswith(m) for message in messages)]
    assert not missing, f"no log line for {missing}"
    assert endpoints["ok"].hints(), "the webhook answering 200 got no hint"

    # None of them carries a secret. The check itself finds a planted one.
    forbidden = flow.forbidden
    some_id = next(v for k, v in forbidden.items() if k.endswith("id (2)"))
    some_key = next(v for k, v in forbidden.items() if k.endswith("signing key (6)"))
    assert leaks([json.dumps({"event": f"sent to {some_id}"})], forbidden)
    assert leaks([json.dumps({"event": f"params (b'{some_key}',)"})], forbidden)
    found = leaks(lines + stdout_path.read_text().splitlines(), forbidden)
    assert not found, "\n".join(found[:20])


async def scripted_flow(
    flow: Flow, receiver: Receiver, apns: FakeApns, fcm: FakeFcm, database_url: str, ingest_token: str
) -> dict[str, Endpoint]:
    topic, welcome, quiet = group_topic(), welcome_topic(), group_topic()
    for name, value in (("topic", topic), ("welcome topic", welcome), ("quiet topic", quiet)):
        flow.forbid(name, value)
    flow.forbid("ingest token", ingest_token)
    flow.forbid("FCM access token", ACCESS_TOKEN)
    flow.forbid("APNs key", keys.apns_key_pem().splitlines()[1])
    flow.forbid("FCM key", json.loads(keys.service_account())["private_key"].splitlines()[1])
    for name, port in (("receiver", receiver.port), ("fake APNs", apns.port), ("fake FCM", fcm.port)):
        flow.forbid(f"{name} address", f"127.0.0.1:{port}")

    # Registrations that are accepted, on every channel.
    endpoints = {
        "ok": receiver.endpoint([200]),
        "gone": receiver.endpoint([410]),
        "missing": receiver.endpoint([404]),
        "broken": receiver.endpoint([500]),
    }
    closed = free_port()
    # The gone ones follow one topic only: once found dead they are deleted, and a second hint for
    # them would be dropped or not depending on timing.
    follows = {"ok": [topic, welcome], "gone": [topic], "missing": [topic], "broken": [topic, welcome]}
    webhooks = {
        name: await flow.recipient(f"webhook {name}", "http", e.url, e.key, follows[name])
        for name, e in endpoints.items()
    }
    for name, e in endpoints.items():
        flow.forbid(f"webhook {name} path", e.path)
    unreachable_url = f"http://127.0.0.1:{closed}/unreachable/{secrets.token_hex(8)}"
    flow.forbid("unreachable address", f"127.0.0.1:{closed}")
    await flow.recipient("webhook unreachable", "http", unreachable_url, secrets.token_bytes(32), [topic])
    tokens = {}
    for channel, names in (("apns", ("ok", "gone", "err")), ("fcm", ("ok", "gone", "internal"))):
        for name in names:
            # Not hex: a long hex run is replaced in any log line, which would hide a leak here.
            token = f"{name}.{secrets.token_urlsafe(16)}"
            tokens[(channel, name)] = token
            await flow.recipient(f"{channel} {name}", channel, token, b"", [topic])

    # Refused registrations and calls, over gRPC and Connect.
    refused_id, refused_secret, refused_key = (
        secrets.token_bytes(32),
        secrets.token_bytes(32),
        secrets.token_bytes(8),
    )
    refused_url = f"ftp://files.example.org/{secrets.token_hex(8)}"
    for name, value in (
        ("refused id", refused_id),
        ("refused secret", refused_secret),
        ("short key", refused_key),
    ):
        flow.forbid(name, value)
    flow.forbid("refused url", refused_url)
    await flow.refused(
        "bad url",
        grpc.StatusCode.INVALID_ARGUMENT,
        pb.RegisterRequest(
            recipient_id=refused_id,
            recipient_secret=refused_secret,
            http=pb.HttpDelivery(url=refused_url, signing_key=secrets.token_bytes(32)),
        ),
    )
    await flow.refused(
        "short signing key",
        grpc.StatusCode.INVALID_ARGUMENT,
        pb.RegisterRequest(
            recipient_id=refused_id,
            recipient_secret=refused_secret,
            http=pb.HttpDelivery(url=endpoints["ok"].url, signing_key=refused_key),
        ),
    )
    await flow.refused(
        "wrong secret",
        grpc.StatusCode.PERMISSION_DENIED,
        pb.UnregisterRequest(recipient_id=webhooks["ok"].rid, recipient_secret=refused_secret),
        "Unregister",
    )
    await flow.refused(
        "unknown recipient",
        grpc.StatusCode.NOT_FOUND,
        pb.UpdateSubscriptionsRequest(
            recipient_id=refused_id, recipient_secret=refused_secret, adds=[pb.Subscription(topic=topic)]
        ),
        "UpdateSubscriptions",
    )
    await flow.refused(
        "malformed topic",
        grpc.StatusCode.INVALID_ARGUMENT,
        pb.UpdateSubscriptionsRequest(
            recipient_id=webhooks["ok"].rid,
            recipient_secret=webhooks["ok"].secret,
            adds=[pb.Subscription(topic=b"\x07" + refused_id)],
        ),
        "UpdateSubscriptions",
    )
    connect = await flow.http.post(
        "/xmtp.backend.v1.NotificationService/Register",
        json={
            "recipientId": base64.b64encode(refused_id).decode(),
            "recipientSecret": base64.b64encode(refused_secret).decode(),
            "http": {"url": refused_url, "signingKey": base64.b64encode(secrets.token_bytes(32)).decode()},
        },
    )
    assert connect.status_code == 400, connect.text

    # Ingest: valid (JSON and protobuf), malformed, and with a wrong token.
    auth = {"authorization": f"Bearer {ingest_token}"}
    batch = [envelope(topic, 11), envelope(quiet, 12, should_push=False)]
    answer = await flow.http.post("/v1/envelopes", json={"envelopes": batch}, headers=auth)
    assert answer.status_code == 202, answer.text
    proto = server_envelope(welcome, 13, payload="welcome_message")
    answer = await flow.http.post(
        "/v1/envelopes", content=proto, headers={**auth, "content-type": "application/x-protobuf"}
    )
    assert answer.status_code == 202, answer.text
    bad_topic = dict(envelope(topic, 14), topic=f"!{base64.b64encode(topic).decode()}!")
    bad_sequence = dict(envelope(topic, 15), sequence_id=f"x{topic.hex()}")
    for bad in (bad_topic, bad_sequence):
        answer = await flow.http.post("/v1/envelopes", json={"envelopes": [bad]}, headers=auth)
        assert answer.status_code == 400, answer.text
    wrong_token = f"wrong-{secrets.token_hex(12)}"
    flow.forbid("wrong ingest token", wrong_token)
    answer = await flow.http.post(
        "/v1/envelopes", json={"envelopes": batch}, headers={"authorization": f"Bearer {wrong_token}"}
    )
    assert answer.status_code == 401, answer.text

    # Every delivery ran its course: one request per hint, MAX_ATTEMPTS where the answer was not final.
    per_hint = {"ok": 1, "gone": MAX_ATTEMPTS, "missing": MAX_ATTEMPTS, "broken": MAX_ATTEMPTS}
    for name, endpoint in endpoints.items():
        want = len(follows[name]) * per_hint[name]
        await wait_until(lambda e=endpoint, n=want: len(e.requests) == n, 20, f"webhook {name}")
    for fake in (apns, fcm):
        channel = "apns" if fake is apns else "fcm"
        for (token_channel, name), token in tokens.items():
            if token_channel == channel:
                want = MAX_ATTEMPTS if name in ("err", "internal") else 1
                await wait_until(
                    lambda f=fake, t=token, w=want: len(f.requests_for(t)) >= w, 20, f"{channel} {name}"
                )
    for (channel, _), token in tokens.items():
        fake_requests = apns.requests_for(token) if channel == "apns" else fcm.requests_for(token)
        if channel == "apns":
            for request in fake_requests:
                flow.forbid(f"APNs JWT {token}", request.jwt)

    if database_url.startswith("postgresql"):
        await break_the_database(flow, database_url, endpoints["ok"])

    await flow.stub.Unregister(
        pb.UnregisterRequest(recipient_id=webhooks["ok"].rid, recipient_secret=webhooks["ok"].secret),
        timeout=10,
    )
    return endpoints


async def break_the_database(flow: Flow, database_url: str, endpoint: Endpoint) -> None:
    """A connection goes away under a Register call: that call fails, the next ones reconnect.
    The call is held on a table lock first, so the break lands inside it and not in whichever
    part of the process happened to touch the database next."""
    dsn = database_url.replace("+asyncpg", "")
    locker = await asyncpg.connect(dsn)
    try:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute("LOCK TABLE recipients IN ACCESS EXCLUSIVE MODE")
        call = asyncio.create_task(flow.recipient("during the break", "http", endpoint.url, endpoint.key, []))
        await _terminate_lock_waiters(locker)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value.code()  # the SDK retries it
        await transaction.rollback()
    finally:
        await locker.close()
    await _recovers(flow, endpoint)


async def _terminate_lock_waiters(locker: asyncpg.Connection) -> None:
    """Terminate every backend of this database that waits on a lock, once one does."""
    waiting = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    for _ in range(200):
        pids = [row["pid"] for row in await locker.fetch(waiting)]
        if pids:
            for pid in pids:
                await locker.execute("SELECT pg_terminate_backend($1)", pid)
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the Register call never reached the locked table")


async def _recovers(flow: Flow, endpoint: Endpoint) -> None:
    for _ in range(30):
        try:
            await flow.recipient("after the break", "http", endpoint.url, endpoint.key, [])
            return
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.code()
    raise AssertionError("the API did not recover from the broken database connection")
