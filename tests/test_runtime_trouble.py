"""Trouble a running command meets, as an operator meets it: the real `xmtp-push` process, its
answers, its log lines and its exit code.

A database the `api` cannot use (it does not exist, refuses the user, has no schema) answers
UNAVAILABLE over gRPC and Connect, and the log says once which setting and what is wrong, with no
ERROR line and no traceback; Redis down is said once per process, naming Redis and its setting, by
`api` at start-up and by a `worker` however many loops meet it. `listen` is ready only while its
firehose stream is open, and says by its setting that the node cannot be reached. `send-test` says
what happened to a hint that did not go: refused, timed out, or the status and what it means. A
second `api` on a taken gRPC port stops with our line alone, and a signing key of the wrong length is
told the allowed range beside the constant message.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from fakes.fake_xmtpd import FakeXmtpd
from fakes.webhook_receiver import Receiver
from tests.support import POSTGRES_ADMIN_DSN, create_sqlite_database, make_settings, running
from tests.support.ops import channel_env, child_env, free_port, register, xmtp_push
from tests.support.own_redis import redis_server
from tests.support.pipeline import REDIS_TEST_URL
from tests.support.process import Child, child, events, wait_answering

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

SERVER = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].split("://", 1)[1].split("@")[-1]  # host:port
PASSWORD = "pw-" + secrets.token_hex(6)
SERVING = re.compile(r"serving http=\S+ grpc=\S+")
DATABASE_CASES = {
    "missing": (f"xmtp_push_no_such_{secrets.token_hex(3)}", "postgres", "the database does not exist: "),
    "credentials": ("postgres", "xmtp_push_no_such_role", "the database refused the user or its password; "),
    # an empty database of the test's own: what is said is where the schema stands and what to run
    "no schema": (None, "postgres", "schema at none, expected [0-9a-f]+: run `xmtp-push migrate`; "),
}


WELCOME = {
    "topic": base64.b64encode(b"\x01" + bytes(32)).decode(),
    "sequence_id": "1",
    "server_ns": 1_700_000_000_000_000_000,
    "kind": "welcome",
}


def postgres(database: str, user: str) -> str:
    return f"postgresql+asyncpg://{user}:{PASSWORD}@{SERVER}/{database}"


def naming(process: Child, setting: str) -> list[str]:
    return [str(e["event"]) for e in events(process) if setting in str(e["event"])]


def assert_no_errors(process: Child) -> None:
    bad = [e for e in events(process) if e.get("level") in ("error", "critical") or "exception" in e]
    assert not bad, process.output()
    assert not any("Traceback" in line for line in process.lines), process.output()


def register_request() -> pb.RegisterRequest:
    return pb.RegisterRequest(
        recipient_id=secrets.token_bytes(32),
        recipient_secret=secrets.token_bytes(32),
        http=pb.HttpDelivery(url="https://example.org/hook", signing_key=b"k" * 32),
    )


async def grpc_register(port: int) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = notification_pb2_grpc.NotificationServiceStub(channel)
        try:
            await stub.Register(register_request(), timeout=20)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def connect_register(port: int) -> tuple[int, object]:
    url = f"http://127.0.0.1:{port}/xmtp.backend.v1.NotificationService/Register"
    async with httpx.AsyncClient(timeout=20) as client:
        response = await client.post(
            url, content=register_request().SerializeToString(), headers={"content-type": "application/proto"}
        )
    return response.status_code, response.json()


@pytest.fixture
async def api_ports() -> AsyncIterator[tuple[int, int]]:
    yield free_port(), free_port()


@pytest.fixture
async def empty_database() -> AsyncIterator[str]:
    """A PostgreSQL database that exists and was never migrated; its name."""
    name = f"xmtp_push_test_{secrets.token_hex(4)}"
    await admin(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def admin(statement: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@pytest.mark.parametrize("case", list(DATABASE_CASES))
async def test_api_on_an_unusable_database_answers_unavailable_and_says_what_is_wrong_once(
    case: str, api_ports: tuple[int, int], empty_database: str
) -> None:
    database, user, problem = DATABASE_CASES[case]
    database = database or empty_database
    http_port, grpc_port = api_ports
    env = child_env(
        database_url=postgres(database, user),
        webhook_enabled="true",
        http_port=str(http_port),
        grpc_port=str(grpc_port),
    )
    async with child("api", ["api"], env) as api:
        await api.line(SERVING)
        for _ in range(3):
            assert await grpc_register(grpc_port) == grpc.StatusCode.UNAVAILABLE
            status, body = await connect_register(http_port)
            assert (status, body) == (503, {"code": "unavailable", "message": "service is unavailable"})
        assert await api.stop() == 0
    told = naming(api, "XMTP_PUSH_DATABASE_URL")
    assert len(told) == 1, api.output()
    assert re.match(f"XMTP_PUSH_DATABASE_URL: {problem}", told[0]), api.output()
    assert PASSWORD not in "\n".join(api.lines) and SERVER not in "\n".join(api.lines)
    assert_no_errors(api)


async def test_api_says_at_start_up_that_redis_is_unreachable(
    tmp_path: Path, api_ports: tuple[int, int]
) -> None:
    http_port, grpc_port = api_ports
    env = child_env(
        database_url=await create_sqlite_database(tmp_path),
        redis_url=f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0",
        ingest_token="t" * 32,
        http_port=str(http_port),
        grpc_port=str(grpc_port),
    )
    async with child("api", ["api"], env) as api:
        await api.line(SERVING)
        async with httpx.AsyncClient(timeout=20) as client:
            for _ in range(3):
                response = await client.post(
                    f"http://127.0.0.1:{http_port}/v1/envelopes",
                    json={"envelopes": [WELCOME]},
                    headers={"authorization": "Bearer " + "t" * 32},
                )
        assert await api.stop() == 0
    told = naming(api, "XMTP_PUSH_REDIS_URL")
    assert told == [
        "XMTP_PUSH_REDIS_URL: Redis is unreachable (connection refused); "
        "serving anyway: what needs it answers UNAVAILABLE until it serves"
    ], api.output()
    assert any(str(e["event"]).startswith("start-up check: database reachable") for e in events(api))
    assert response.status_code == 503
    assert PASSWORD not in "\n".join(api.lines)
    assert_no_errors(api)


@pytest.mark.tools("redis-server")
async def test_a_worker_says_once_that_redis_is_down_and_once_that_it_is_back(tmp_path: Path) -> None:
    port = free_port()
    env = child_env(
        database_url=await create_sqlite_database(tmp_path),
        redis_url=f"redis://127.0.0.1:{port}/0",
        webhook_enabled="true",
        metrics_port="0",
    )
    async with child("worker", ["worker"], env) as worker:
        await worker.line(re.compile("XMTP_PUSH_REDIS_URL: Redis is unreachable"))
        await asyncio.sleep(3)  # every loop has met the outage by now, several times
        async with redis_server(port, keeps_in=tmp_path):  # kept, so no warning that it keeps nothing
            await worker.line(re.compile("XMTP_PUSH_REDIS_URL: Redis answers again"), timeout=30)
            await asyncio.sleep(1)
            assert await worker.stop() == 0
    told = naming(worker, "XMTP_PUSH_REDIS_URL")
    assert len(told) == 2, worker.output()
    assert told[0].startswith("XMTP_PUSH_REDIS_URL: Redis is unreachable (connection refused); ")
    assert told[1] == "XMTP_PUSH_REDIS_URL: Redis answers again"
    assert not any("Redis or the database" in line for line in worker.lines)
    assert_no_errors(worker)


@pytest.mark.redis
async def test_listen_is_not_ready_until_the_firehose_is_open_and_names_the_node_setting(
    tmp_path: Path,
) -> None:
    node_port = free_port()  # nothing listens there until the node starts
    env = child_env(
        database_url=await create_sqlite_database(tmp_path),
        redis_url=REDIS_TEST_URL,
        xmtpd_address=f"127.0.0.1:{node_port}",
        xmtpd_tls="false",
        metrics_port="0",
    )
    async with child("listen", ["listen"], env) as listen:
        readyz = f"http://127.0.0.1:{await listen.probe_port()}/readyz"
        await listen.line(re.compile("XMTP_PUSH_XMTPD_ADDRESS: the xmtpd node is unreachable"))
        await asyncio.sleep(2)  # a few more attempts, none told again
        response = await wait_answering(readyz)
        assert response.status_code == 503, response.text
        assert response.json()["checks"] == {"database": "ok", "redis": "ok", "firehose": "unavailable"}
        node = await FakeXmtpd(keepalive_seconds=0.25).start(node_port)
        try:
            await listen.line(re.compile("XMTP_PUSH_XMTPD_ADDRESS: the xmtpd node answers again"), timeout=45)
            response = await wait_answering(readyz)
            assert response.status_code == 200, response.text
            assert response.json()["checks"]["firehose"] == "ok"
            assert await listen.stop() == 0
        finally:
            await node.stop()
    told = naming(listen, "XMTP_PUSH_XMTPD_ADDRESS")
    assert told == [
        "XMTP_PUSH_XMTPD_ADDRESS: the xmtpd node is unreachable (UNAVAILABLE); retrying with backoff",
        "XMTP_PUSH_XMTPD_ADDRESS: the xmtpd node answers again",
    ], listen.output()
    assert_no_errors(listen)


SEND_TEST_CASES = {
    "refused": ("failed", "connection refused"),
    "timed out": ("failed", "timed out: no answer within XMTP_PUSH_PROVIDER_TIMEOUT_SECONDS"),
    "signature": (
        "rejected",
        "HTTP 400 Bad Request: the receiver refused the push (does it verify with the signing key registered?)",
    ),
    "unauthorized": (
        "rejected",
        "HTTP 401 Unauthorized: the receiver refused the push's signature (is the signing key registered its key?)",
    ),
    "server error": (
        "failed",
        "HTTP 503 Service Unavailable: the receiver failed to take it (a transient failure: the pipeline retries it)",
    ),
}


async def test_send_test_says_what_happened_to_a_hint_that_did_not_go(postgresql_url: str) -> None:
    async with Receiver() as receiver, running(make_settings(postgresql_url)) as api:
        key = secrets.token_bytes(32)
        targets = {
            "refused": (f"http://127.0.0.1:{free_port()}/hook", key),
            "timed out": (receiver.endpoint([200], delays=[5.0], key=key).url, key),
            # the receiver verifies with a key other than the one registered
            "signature": (receiver.endpoint([200]).url, key),
            "unauthorized": (receiver.endpoint([401], key=key).url, key),
            "server error": (receiver.endpoint([503], key=key).url, key),
        }
        registered = {
            case: await register(api.stub, "http", url, signing_key)
            for case, (url, signing_key) in targets.items()
        }
        env = channel_env(postgresql_url, provider_timeout_seconds="1")
        results = await asyncio.gather(
            *(xmtp_push("send-test", registered[case].rid.hex(), env=env) for case in SEND_TEST_CASES)
        )
        receiver.released.set()
    for (case, (outcome, reason)), result in zip(SEND_TEST_CASES.items(), results, strict=True):
        assert result.returncode == 1, result
        assert re.fullmatch(f"http: {outcome} in \\d+ ms: {re.escape(reason)}\n", result.stdout), (
            case,
            result,
        )
        assert "127.0.0.1" not in result.stdout + result.stderr, result


async def test_a_second_api_on_a_taken_grpc_port_says_one_line_of_ours(tmp_path: Path) -> None:
    database = await create_sqlite_database(tmp_path)
    grpc_port = free_port()
    first_env = child_env(database_url=database, http_port=str(free_port()), grpc_port=str(grpc_port))
    second_env = child_env(database_url=database, http_port=str(free_port()), grpc_port=str(grpc_port))
    async with child("api", ["api"], first_env) as first:
        await first.line(SERVING)
        second = await xmtp_push("api", env=second_env)
        assert await first.stop() == 0
    assert second.returncode == 3, second
    assert second.stderr.splitlines()[-1] == (
        f"xmtp-push: gRPC address 127.0.0.1:{grpc_port} is in use or cannot be bound"
    ), second
    assert "add_port" not in second.stderr + second.stdout, second
    assert not any(line.startswith(("E1", "W1", "I1")) for line in second.stderr.splitlines()), second


async def test_a_signing_key_of_the_wrong_length_is_told_the_allowed_range(
    tmp_path: Path, api_ports: tuple[int, int]
) -> None:
    """The message stays the contract's constant; the range travels beside it as a google.rpc.BadRequest
    field violation (gRPC status details, Connect error details) and is in the log line."""
    http_port, grpc_port = api_ports
    env = child_env(
        database_url=await create_sqlite_database(tmp_path),
        webhook_enabled="true",
        http_port=str(http_port),
        grpc_port=str(grpc_port),
        webhook_allow_private_addresses="true",
        log_level="INFO",
    )
    request = register_request()
    request.http.url = "https://127.0.0.1/hook"  # allowed here: the key length is what is refused
    request.http.signing_key = b"k" * 15
    violation = error_details_pb2.BadRequest.FieldViolation(
        field="http.signing_key", description="must be 16 to 64 bytes"
    )
    async with child("api", ["api"], env) as api:
        await api.line(SERVING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await notification_pb2_grpc.NotificationServiceStub(channel).Register(request, timeout=20)
        async with httpx.AsyncClient(timeout=20) as client:
            response = await client.post(
                f"http://127.0.0.1:{http_port}/xmtp.backend.v1.NotificationService/Register",
                content=request.SerializeToString(),
                headers={"content-type": "application/proto"},
            )
        await api.line(re.compile("Register answered invalid_argument: webhook signing key length"))
        assert await api.stop() == 0
    error = refused.value
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "webhook signing key length is not allowed",
    )
    (trailer,) = [value for key, value in error.trailing_metadata() or () if key == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(trailer)
    assert (status.code, status.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], error.details())
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert list(bad_request.field_violations) == [violation]
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["message"]) == (
        "invalid_argument",
        "webhook signing key length is not allowed",
    )
    (detail,) = body["details"]
    assert detail["type"] == "google.rpc.BadRequest"
    value = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
    assert list(error_details_pb2.BadRequest.FromString(value).field_violations) == [violation]
    assert detail["debug"] == {
        "fieldViolations": [{"field": "http.signing_key", "description": "must be 16 to 64 bytes"}]
    }
    told = [str(e["event"]) for e in events(api) if "signing key length" in str(e["event"])]
    assert (
        told
        == [
            "Register answered invalid_argument: webhook signing key length is not allowed "
            "(http.signing_key must be 16 to 64 bytes)"
        ]
        * 2
    ), api.output()
