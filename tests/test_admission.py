"""Every row of the admission table (docs/recipients.md#admission-order), over gRPC and Connect.

Each refused request is sent over gRPC and Connect JSON (some also over Connect
binary) and checked for its exact code and message, and for leaving every stored
row (recipients with their topic_count, and subscriptions) as it was. The
ordering tests combine two failing conditions and expect the earlier row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.runtime import open_runtime
from tests.support import Api, make_settings
from tests.support.builders import (
    ALL_TRANSPORTS,
    BAD_SECRET,
    KEY_LENGTH,
    MALFORMED,
    NOT_CONFIGURED,
    NOT_CONFIGURED_MESSAGE,
    NOT_REGISTERED,
    SUBSCRIPTION_MALFORMED,
    TOPIC_LIMIT,
    TRANSPORTS,
    URL_NOT_ALLOWED,
    Creds,
    Failure,
    Snapshot,
    accepted,
    adds_of,
    apns,
    b64,
    call,
    connect_post,
    fcm,
    group_topic,
    grpc_raw,
    hmac_key,
    http,
    new_creds,
    ok,
    refused,
    register,
    seeded,
    snapshot,
    sub,
    unregister,
    update,
    welcome_topic,
)
from workers.server import running_api

ApiWith = Callable[..., AbstractAsyncContextManager[Api]]
METHODS = ("Register", "Unregister", "UpdateSubscriptions")
INVALID = "invalid_argument"
EXHAUSTED = "resource_exhausted"
DEADLINE = ("deadline_exceeded", "request did not finish in time")
SIGNING_KEY_OK = b"s" * 16


def request_for(method: str, creds: Creds) -> Any:
    """A request of `method` that would succeed for a registered recipient with these credentials."""
    if method == "Register":
        return register(creds)
    if method == "Unregister":
        return unregister(creds)
    return update(creds, adds_of(group_topic()))


def wrong_secret(creds: Creds) -> Creds:
    """Same id, a secret that differs from the registered one in a single bit."""
    return Creds(creds.rid, bytes([creds.secret[0] ^ 1]) + creds.secret[1:])


def bad_credentials(creds: Creds) -> list[Creds]:
    rid, secret = creds.rid, creds.secret
    return [
        Creds(b"", secret),
        Creds(rid[:31], secret),
        Creds(rid + b"\x00", secret),
        Creds(rid, b""),
        Creds(rid, secret[:31]),
        Creds(rid, secret + b"\x00"),
    ]


# --- row 1: the request does not decode, or id / secret not 32 bytes ------------


async def test_row1_credentials_not_32_bytes(api: Api) -> None:
    creds, _ = await seeded(api)
    for method in METHODS:
        for bad in bad_credentials(creds):
            await refused(api, request_for(method, bad), INVALID, MALFORMED, ALL_TRANSPORTS)


async def test_row1_garbage_bytes_over_grpc(api: Api) -> None:
    await seeded(api)
    before = await snapshot(api)
    for method in METHODS:
        valid = request_for(method, new_creds()).SerializeToString()
        for body in (b"\xff\xff\xff\xff\xff", valid[:-1], b"\x0a"):
            assert await grpc_raw(api, method, body) == Failure(INVALID, MALFORMED), (method, body)
    assert await snapshot(api) == before


UNDECODABLE_JSON = [
    b"{not json",
    b"",
    b"null",
    b"\xff\xfe\x00",
    b'{"recipientId": 12}',
    b'{"recipientId": "AAAA"} trailing',
    b'{"recipientSecret": ["AAAA"]}',
]


async def test_row1_undecodable_connect_bodies(api: Api) -> None:
    await seeded(api)
    before = await snapshot(api)
    for method in METHODS:
        for body in UNDECODABLE_JSON:
            reply = await connect_post(api, method, body, "application/json")
            assert reply == Failure(INVALID, MALFORMED), (method, body)
        valid = request_for(method, new_creds()).SerializeToString()
        for body in (b"\xff\xff\xff\xff\xff", valid[:-1]):
            reply = await connect_post(api, method, body, "application/proto")
            assert reply == Failure(INVALID, MALFORMED), (method, body)
    assert await snapshot(api) == before


async def test_row1_undecodable_json_fields_of_update(api: Api) -> None:
    creds, _ = await seeded(api)
    before = await snapshot(api)
    ids = f'"recipientId": "{b64(creds.rid)}", "recipientSecret": "{b64(creds.secret)}"'
    for tail in (
        '"adds": "x"',
        '"adds": [{"hmacEpochBase": "x"}]',
        '"removes": [12]',
        '"adds": [{"topic": 5}]',
    ):
        body = ("{" + ids + ", " + tail + "}").encode()
        reply = await connect_post(api, "UpdateSubscriptions", body, "application/json")
        assert reply == Failure(INVALID, MALFORMED), tail
    assert await snapshot(api) == before


async def test_row1_before_every_later_row(api_with: ApiWith) -> None:
    async with api_with(webhook_enabled=False, max_push_topics=2) as api:
        creds, _ = await seeded(api)
        short = Creds(creds.rid, creds.secret[:31])  # known id: row 3 would apply
        unknown_short = Creds(new_creds().rid[:31], creds.secret)  # row 2 would apply
        too_many = adds_of(group_topic(), group_topic(), group_topic())
        for request in (
            unregister(unknown_short),
            update(unknown_short, adds_of(b"\x09")),
            register(short, http("ftp://x", b"")),  # rows 4..7
            register(Creds(b"", creds.secret), http()),  # row 4
            update(short, adds_of(b"\x09")),  # row 8
            update(short, too_many),  # row 9
        ):
            await refused(api, request, INVALID, MALFORMED)


# --- row 2: unknown recipient ---------------------------------------------------


async def test_row2_unknown_recipient(api: Api) -> None:
    await seeded(api)
    unknown = new_creds()
    for request in (unregister(unknown), update(unknown, adds_of(group_topic())), update(unknown)):
        await refused(api, request, "not_found", NOT_REGISTERED, ALL_TRANSPORTS)


async def test_row2_before_subscription_and_limit_checks(api_with: ApiWith) -> None:
    async with api_with(max_push_topics=1) as api:
        await seeded(api, topics=1)
        unknown = new_creds()
        topic = group_topic()
        for request in (
            update(unknown, adds_of(b"\x02" + b"x" * 16)),
            update(unknown, adds_of(topic), [topic]),
            update(unknown, [sub(group_topic(), keys=(hmac_key(),) * 4)]),
            update(unknown, adds_of(group_topic(), group_topic())),
        ):
            await refused(api, request, "not_found", NOT_REGISTERED)


# --- row 3: wrong secret --------------------------------------------------------


async def test_row3_wrong_secret(api: Api) -> None:
    creds, _ = await seeded(api, topics=2, delivery=apns("stored-token"))
    for method in METHODS:
        request = request_for(method, wrong_secret(creds))
        await refused(api, request, "permission_denied", BAD_SECRET, ALL_TRANSPORTS)


async def test_row3_register_wrong_secret_before_later_rows(api_with: ApiWith) -> None:
    async with api_with(fcm_service_account=None) as api:
        creds, _ = await seeded(api, delivery=apns())
        other = wrong_secret(creds)
        for request in (
            register(other, fcm()),  # channel not configured
            register(other, http("ftp://127.0.0.1/")),  # url not allowed
            register(other, http(signing_key=b"short")),  # signing key length
            register(other, {}),  # delivery unset
            register(other, apns("")),  # empty token
            register(other, apns(), metadata=b"m" * 4097),  # metadata too big
        ):
            await refused(api, request, "permission_denied", BAD_SECRET)


async def test_row3_update_wrong_secret_before_later_rows(api_with: ApiWith) -> None:
    async with api_with(max_push_topics=3) as api:
        creds, topics = await seeded(api, topics=3)
        other = wrong_secret(creds)
        for request in (
            update(other, adds_of(b"\x02" + b"x" * 16)),
            update(other, adds_of(topics[0]), [topics[0]]),
            update(other, [sub(group_topic(), base=-1)]),
            update(other, adds_of(group_topic())),  # would exceed the limit
        ):
            await refused(api, request, "permission_denied", BAD_SECRET)


# --- row 4: channel not configured ------------------------------------------------

UNCONFIGURED = [
    pytest.param({"apns_key": None}, apns(), id="apns"),
    pytest.param({"apns_team_id": None}, apns(), id="apns-partial"),
    pytest.param({"fcm_service_account": None}, fcm(), id="fcm"),
    pytest.param({"webhook_enabled": False}, http(), id="http"),
]


@pytest.mark.parametrize(("overrides", "delivery"), UNCONFIGURED)
async def test_row4_channel_not_configured(
    api_with: ApiWith, overrides: dict[str, Any], delivery: dict[str, Any]
) -> None:
    async with api_with(**overrides) as api:
        creds, _ = await seeded(api, delivery=apns() if "fcm" in delivery else fcm())
        for who in (new_creds(), creds):  # a new recipient, and a known one switching channel
            request = register(who, delivery)
            await refused(api, request, "failed_precondition", NOT_CONFIGURED[request.WhichOneof("delivery")])
        # the configured channels still work
        other = fcm() if "fcm" not in delivery else apns()
        assert all(state.topic_count == 0 for state in await accepted(api, register(new_creds(), other)))


async def test_row4_the_operator_is_told_once_per_channel_what_configures_it(
    api_with: ApiWith, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller gets the constant message over gRPC and Connect; the log gets one WARNING per
    channel naming the settings it needs, however many calls ask for it."""
    async with api_with(webhook_enabled=False, fcm_service_account=None) as api:
        with caplog.at_level(logging.WARNING, logger="app.recipients"):
            for _ in range(3):
                await refused(
                    api, register(new_creds(), http()), "failed_precondition", NOT_CONFIGURED_MESSAGE
                )
                await refused(
                    api, register(new_creds(), fcm()), "failed_precondition", NOT_CONFIGURED_MESSAGE
                )
    told = [r.getMessage() for r in caplog.records if r.name == "app.recipients.service"]
    assert told == [
        "Register asked for channel http, which is not configured: it needs XMTP_PUSH_WEBHOOK_ENABLED=true",
        "Register asked for channel fcm, which is not configured: it needs XMTP_PUSH_FCM_SERVICE_ACCOUNT",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "app.recipients.service")


async def test_row4_before_url_key_and_target_checks(api_with: ApiWith) -> None:
    async with api_with(webhook_enabled=False, apns_key=None) as api:
        await seeded(api)
        for request in (
            register(new_creds(), http("ftp://127.0.0.1/hook", SIGNING_KEY_OK)),
            register(new_creds(), http("https://user:pw@127.0.0.1/", SIGNING_KEY_OK)),
            register(new_creds(), http(signing_key=b"")),
            register(new_creds(), http("https://127.0.0.1/" + "a" * 3000)),
            register(new_creds(), apns("")),
            register(new_creds(), apns("a\x00b")),
            register(new_creds(), apns(), metadata=b"m" * 5000),
        ):
            await refused(api, request, "failed_precondition", NOT_CONFIGURED[request.WhichOneof("delivery")])


# --- row 5: webhook URL not allowed -----------------------------------------------


async def _urls_refused(api: Api, urls: list[str]) -> None:
    for url in urls:
        await refused(api, register(new_creds(), http(url)), INVALID, URL_NOT_ALLOWED)


async def _urls_accepted(api: Api, urls: list[str]) -> None:
    for url in urls:
        for state in await accepted(api, register(new_creds(), http(url))):
            assert state.channel == pb.CHANNEL_HTTP, url


async def test_row5_scheme_userinfo_and_resolution(api: Api) -> None:
    await seeded(api)
    await _urls_refused(
        api,
        [
            "",
            "ftp://127.0.0.1/hook",
            "ws://127.0.0.1/hook",
            "127.0.0.1/hook",
            "//127.0.0.1/hook",
            "https:///hook",
            "https://127.0.0.1:99999/hook",
            "https://user:pw@127.0.0.1/hook",
            "https://user@127.0.0.1/hook",
            "https://:pw@127.0.0.1/hook",
            "https://@127.0.0.1/hook",
            "https://does-not-exist.invalid/hook",
            "https://does-not-exist.invalid:8443/" + "a" * 3000,  # also too long: row 5 first
        ],
    )
    # this deployment allows http and private targets, so these pass
    await _urls_accepted(api, ["https://127.0.0.1/hook", "http://127.0.0.1:8080/h", "https://localhost/"])


async def test_row5_http_refused_when_insecure_disallowed(api_with: ApiWith) -> None:
    async with api_with(webhook_allow_insecure=False) as api:
        await seeded(api)
        await _urls_refused(api, ["http://127.0.0.1/hook", "HTTP://127.0.0.1/hook", "http://localhost/"])
        await _urls_accepted(api, ["https://127.0.0.1/hook", "HTTPS://127.0.0.1/hook"])


async def test_row5_allowed_domains(api_with: ApiWith) -> None:
    # Only names that resolve here can prove the domain check itself: localhost and IP literals.
    async with api_with(webhook_allowed_domains=("LocalHost", "*.0.0.1")) as api:
        await seeded(api)
        await _urls_accepted(
            api, ["https://localhost/hook", "https://LOCALHOST:8443/x", "https://127.0.0.1/h"]
        )
        await _urls_refused(api, ["https://127.0.0.2/hook", "https://[::1]/hook", "https://10.0.0.2/"])


async def test_row5_wildcard_needs_one_more_label(api_with: ApiWith) -> None:
    async with api_with(webhook_allowed_domains=("*.localhost", "*.27.0.0.1")) as api:
        await seeded(api)
        # "localhost" is the bare suffix; "127.0.0.1" ends with "27.0.0.1" but not with ".27.0.0.1"
        await _urls_refused(api, ["https://localhost/hook", "https://127.0.0.1/hook"])


BLOCKED_URLS = [
    "https://127.0.0.1/hook",
    "https://127.255.0.9/hook",
    "https://localhost/hook",
    "https://10.0.0.1/hook",
    "https://0.0.0.0/hook",
    "https://100.64.0.1/hook",
    "https://169.254.169.254/latest",
    "https://172.16.0.1/hook",
    "https://172.31.255.254/hook",
    "https://192.168.1.1/hook",
    "https://224.0.0.1/hook",
    "https://255.255.255.255/hook",
    "https://[::]/hook",
    "https://[::1]/hook",
    "https://[fc00::1]/hook",
    "https://[fd12:3456::1]/hook",
    "https://[fe80::1]/hook",
    "https://[fec0::1]/hook",
    "https://[ff02::1]/hook",
    "https://[::ffff:127.0.0.1]/hook",
    "https://[::ffff:10.0.0.1]/hook",
    "https://[::ffff:169.254.169.254]/hook",
]
PUBLIC_URLS = [
    "https://93.184.216.34/hook",
    "https://172.32.0.1/hook",
    "https://100.128.0.1/hook",
    "https://[2606:4700:4700::1111]/hook",
    "https://[::ffff:8.8.8.8]/hook",
]


async def test_row5_blocked_addresses(api_with: ApiWith) -> None:
    async with api_with(webhook_allow_private_addresses=False) as api:
        await seeded(api)
        await _urls_refused(api, BLOCKED_URLS)
        await _urls_accepted(api, PUBLIC_URLS)


async def test_row5_before_signing_key_and_target_checks(api: Api) -> None:
    await seeded(api)
    for request in (
        register(new_creds(), http("ftp://127.0.0.1/hook", b"")),
        register(new_creds(), http("https://u:p@127.0.0.1/", b"x" * 65)),
        register(new_creds(), http("ftp://127.0.0.1/" + "a" * 3000)),
        register(new_creds(), http("ftp://127.0.0.1/a\x00b")),
        register(new_creds(), http("ftp://127.0.0.1/"), metadata=b"m" * 4097),
    ):
        await refused(api, request, INVALID, URL_NOT_ALLOWED)


# --- row 6: signing key length ----------------------------------------------------


async def test_row6_signing_key_length(api: Api) -> None:
    await seeded(api)
    for key in (b"", b"k" * 15, b"k" * 65, b"k" * 200):
        await refused(api, register(new_creds(), http(signing_key=key)), INVALID, KEY_LENGTH, ALL_TRANSPORTS)
    for key in (b"k" * 16, b"k" * 64):
        states = await accepted(api, register(new_creds(), http(signing_key=key)), ALL_TRANSPORTS)
        assert [state.channel for state in states] == [pb.CHANNEL_HTTP] * 3


async def test_row6_before_target_checks(api: Api) -> None:
    await seeded(api)
    for request in (
        register(new_creds(), http("https://127.0.0.1/" + "a" * 3000, b"k" * 15)),
        register(new_creds(), http("https://127.0.0.1/a\x00b", b"k" * 65)),
        register(new_creds(), http(signing_key=b""), metadata=b"m" * 4097),
    ):
        await refused(api, request, INVALID, KEY_LENGTH)


# --- row 7: target, delivery and metadata -----------------------------------------


async def test_row7_bad_targets(api: Api) -> None:
    creds, _ = await seeded(api, delivery=fcm("kept"))
    long_url = "https://127.0.0.1/" + "a" * (2049 - len("https://127.0.0.1/"))
    for who in (new_creds(), creds):
        for delivery in (
            apns(""),
            fcm(""),
            apns("t" * 2049),
            fcm("t" * 2049),
            apns("tok\x00en"),
            fcm("\x00"),
            http(long_url),
            http("https://127.0.0.1/a\x00b"),
        ):
            await refused(api, register(who, delivery), INVALID, MALFORMED, ALL_TRANSPORTS)


async def test_row7_delivery_unset_and_metadata_too_big(api: Api) -> None:
    creds, _ = await seeded(api)
    for who in (new_creds(), creds):
        for request in (
            register(who, {}),
            register(who, {}, metadata=b"m"),
            register(who, fcm(), metadata=b"m" * 4097),
            register(who, http(), metadata=b"m" * 4097),
        ):
            await refused(api, request, INVALID, MALFORMED)


async def test_row7_limits_themselves_are_accepted(api: Api) -> None:
    url = "https://127.0.0.1/" + "a" * (2048 - len("https://127.0.0.1/"))
    for delivery in (apns("t" * 2048), fcm("é" * 2048), http(url)):
        await accepted(api, register(new_creds(), delivery))
    await accepted(api, register(new_creds(), fcm(), metadata=b"m" * 4096))
    await accepted(api, register(new_creds(), fcm(), metadata=b""))


# --- row 8: subscriptions ---------------------------------------------------------


def malformed_updates(creds: Creds, subscribed: bytes) -> list[pb.UpdateSubscriptionsRequest]:
    g, w = group_topic(), welcome_topic()
    bad_topics = [
        b"",
        b"\x02" + b"x" * 16,
        b"\x02" + b"x" * 32,
        b"\xff" + b"x" * 16,
        b"\x00" + b"x" * 15,
        b"\x00" + b"x" * 17,
        b"\x00" + b"x" * 32,
        b"\x01" + b"x" * 16,
        b"\x01" + b"x" * 31,
        b"\x01" + b"x" * 33,
    ]
    requests = [update(creds, adds_of(g, topic)) for topic in bad_topics]
    requests += [update(creds, adds_of(g), [topic]) for topic in bad_topics[1:4]]
    requests += [
        update(creds, adds_of(g, g)),
        update(creds, adds_of(g), [g]),
        update(creds, adds_of(subscribed), [subscribed]),
        update(creds, [], [w, w]),
        update(creds, [sub(g, base=-1, keys=(hmac_key(),))]),
        update(creds, [sub(g, base=-1)]),
        update(creds, [sub(g, keys=(hmac_key(),) * 4)]),
        update(creds, [sub(g, keys=(b"k" * 41,))]),
        update(creds, [sub(g, keys=(hmac_key(), b"k" * 43))]),
        update(creds, [sub(g, keys=(b"",))]),
        update(creds, [sub(w), sub(g, keys=(hmac_key(),) * 4)]),
    ]
    return requests


async def test_row8_malformed_subscriptions(api: Api) -> None:
    creds, topics = await seeded(api, topics=2)
    for request in malformed_updates(creds, topics[0]):
        await refused(api, request, INVALID, SUBSCRIPTION_MALFORMED, ALL_TRANSPORTS)


async def test_row8_well_formed_edges_are_accepted(api: Api) -> None:
    keys3 = (hmac_key(1), hmac_key(2), hmac_key(3))
    for transport in ALL_TRANSPORTS:
        creds, topics = await seeded(api, topics=1)
        adds = [
            sub(group_topic(), keys=keys3),
            sub(welcome_topic(), base=2**62, keys=keys3),
            sub(welcome_topic()),
        ]
        state = await ok(api, transport, update(creds, adds, [topics[0], group_topic()]))
        assert state.topic_count == 3, transport


# --- row 9: topic limit -----------------------------------------------------------


async def test_row9_topic_limit(api_with: ApiWith) -> None:
    async with api_with(max_push_topics=3) as api:
        creds, _ = await seeded(api, topics=2)
        fresh, _ = await seeded(api, topics=0)
        absent = group_topic()  # removing a topic that is not stored frees nothing
        for request in (
            update(creds, adds_of(group_topic(), group_topic())),
            update(creds, adds_of(group_topic(), group_topic()), [absent]),
            update(fresh, adds_of(*(group_topic() for _ in range(4)))),
        ):
            await refused(api, request, EXHAUSTED, TOPIC_LIMIT, ALL_TRANSPORTS)
        # row 8 is decided before the limit
        request = update(creds, adds_of(group_topic(), group_topic(), b"\x02" + b"x" * 16))
        await refused(api, request, INVALID, SUBSCRIPTION_MALFORMED)


async def test_row9_counts_what_the_request_would_leave(api_with: ApiWith) -> None:
    async with api_with(max_push_topics=3) as api:
        for transport in TRANSPORTS:
            creds, topics = await seeded(api, topics=2)
            # two adds and one remove of a stored topic leave exactly 3
            request = update(creds, adds_of(group_topic(), group_topic()), [topics[0]])
            assert (await ok(api, transport, request)).topic_count == 3, transport
            # re-adding a stored topic (with new keys) adds nothing
            again = update(creds, [sub(topics[1], base=4, keys=(hmac_key(),))])
            assert (await ok(api, transport, again)).topic_count == 3, transport
            await refused(api, update(creds, adds_of(group_topic())), EXHAUSTED, TOPIC_LIMIT, (transport,))


# --- row 10: database unreachable -------------------------------------------------

CLOSED_PORT_URL = "postgresql+asyncpg://postgres@127.0.0.1:1/x"


@contextlib.asynccontextmanager
async def unreachable_api() -> AsyncIterator[Api]:
    """An API whose database does not answer (nothing listens on port 1)."""
    async with open_runtime(make_settings(CLOSED_PORT_URL)) as runtime, running_api(runtime) as servers:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{servers.grpc_port}")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{servers.http_port}", timeout=30) as client:
            try:
                stub = notification_pb2_grpc.NotificationServiceStub(channel)  # type: ignore[no-untyped-call]
                yield Api(runtime, channel, stub, client, servers.http_port, servers.grpc_port)
            finally:
                await channel.close(grace=None)


async def test_row10_database_unreachable() -> None:
    async with unreachable_api() as api:
        creds = new_creds()
        for transport in ALL_TRANSPORTS:
            for method in METHODS:
                started = time.monotonic()
                reply = await call(api, transport, request_for(method, creds))
                assert reply == Failure("unavailable", "service is unavailable"), (transport, method)
                assert time.monotonic() - started < 15
            # row 1 is decided before the database is asked
            short = Creds(creds.rid[:31], creds.secret)
            assert await call(api, transport, request_for("Register", short)) == Failure(INVALID, MALFORMED)
            assert await grpc_raw(api, "Register", b"\xff\xff") == Failure(INVALID, MALFORMED)


# --- deadlines ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def holding_lock(database_url: str, rid: bytes) -> AsyncIterator[None]:
    """Block writers of this recipient from another connection until the block exits."""
    if database_url.startswith("sqlite"):
        connection = sqlite3.connect(database_url.split(":///", 1)[1], isolation_level=None, timeout=5)
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
            connection.close()
        return
    pg = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with pg.transaction():
            locked = await pg.fetch("SELECT id FROM recipients WHERE id = $1 FOR UPDATE", rid)
            assert len(locked) == 1
            yield
    finally:
        await pg.close()


async def _timed(api: Api, transport: str, request: Any, **options: Any) -> tuple[Any, float]:
    started = time.monotonic()
    reply = await call(api, transport, request, **options)
    return reply, time.monotonic() - started


async def _assert_nothing_applied(api: Api, creds: Creds, before: Snapshot) -> None:
    # A later update queues behind anything still holding the recipient (or, on
    # SQLite, the one pooled connection), so late work would show up by then.
    topic = group_topic()
    state = await ok(api, "grpc", update(creds, adds_of(topic)))
    after = await snapshot(api)
    assert state.topic_count == len(before.subscriptions) + 1
    assert [row for row in after.subscriptions if row[1] != topic] == list(before.subscriptions)


@pytest.mark.slow
async def test_deadline_exceeded_when_blocked(api_with: ApiWith, database_url: str) -> None:
    async with api_with(request_timeout_seconds=0.3) as api:
        creds, _ = await seeded(api)
        before = await snapshot(api)
        async with holding_lock(database_url, creds.rid):
            for transport in ALL_TRANSPORTS:
                reply, seconds = await _timed(api, transport, update(creds, adds_of(group_topic())))
                assert reply == Failure(*DEADLINE), transport
                assert 0.25 < seconds < 3, (transport, seconds)
            # a client allowing more time than the server's limit still gets the limit
            long_wait = {"connect-timeout-ms": "60000"}
            reply, seconds = await _timed(
                api, "json", update(creds, adds_of(group_topic())), headers=long_wait
            )
            assert reply == Failure(*DEADLINE)
            assert seconds < 3
        await _assert_nothing_applied(api, creds, before)


@pytest.mark.slow
async def test_client_deadlines_shorter_than_the_limit_are_honoured(
    api_with: ApiWith, database_url: str
) -> None:
    async with api_with(request_timeout_seconds=20) as api:
        creds, _ = await seeded(api)
        before = await snapshot(api)
        async with holding_lock(database_url, creds.rid):
            request = update(creds, adds_of(group_topic()))
            reply, seconds = await _timed(api, "json", request, headers={"connect-timeout-ms": "300"})
            assert reply == Failure(*DEADLINE)
            assert 0.25 < seconds < 5
            reply, seconds = await _timed(api, "grpc", update(creds, adds_of(group_topic())), timeout=0.3)
            assert isinstance(reply, Failure) and reply.code == "deadline_exceeded"
            assert seconds < 5
            await asyncio.sleep(0.2)  # the gRPC deadline has passed on the server too
        # neither call went on waiting for the lock: nothing lands once it is released
        await _assert_nothing_applied(api, creds, before)
