"""The APNs channel on the wire: ApnsProvider (aioapns underneath) against a local HTTP/2 APNs.

Nothing of ours is replaced: the provider, aioapns, h2 and TLS run for real; only Apple's server is
the fake in fakes/fake_apns.py, which records every header and body and answers per device token.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from prometheus_client import REGISTRY

from app.core.config import Settings, SettingsError
from app.delivery.credentials import apns_credentials
from app.delivery.providers.apns import ApnsProvider, SharedToken
from app.delivery.providers.apns_connection import CLOSED_STREAMS_KEPT
from app.delivery.types import ApnsExtras, OutcomeKind, Priority, Push, PushKind
from app.fanout.hints import Hint, apns_push
from app.recipients.types import Target
from fakes import keys
from fakes.fake_apns import FakeApns, Reply
from fakes.tls import TlsFiles, make_tls_files
from tests.support import make_settings

NO_DATABASE = "sqlite+aiosqlite:///unused.db"
BUNDLE_ID, KEY_ID, TEAM_ID = "org.example.app", "KEYID12345", "TEAMID1234"
TOPIC = b"\x00" + bytes(range(16))
TOPIC_B64 = base64.b64encode(TOPIC).decode()
SEQUENCE_ID = 18_446_744_073_709_551_615  # uint64 max: travels as decimal text
APNS_CHANNEL = 1


@pytest.fixture
def fake(apns_server: FakeApns) -> Iterator[FakeApns]:
    apns_server.reset()
    yield apns_server
    assert apns_server.failures == []  # every request we sent was well-formed HTTP/2


def apns_settings(fake: FakeApns, **overrides: Any) -> Settings:
    return make_settings(NO_DATABASE, apns_endpoint=fake.endpoint, apns_ca_file=fake.tls.ca_file, **overrides)


@pytest.fixture
async def provider(fake: FakeApns) -> AsyncIterator[ApnsProvider]:
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=5.0)
    yield apns
    await apns.close()


def hint(sequence_id: int = SEQUENCE_ID, topic: bytes = TOPIC) -> Hint:
    return Hint(topic, sequence_id, b"\x01" * 32)


def device(token: str) -> Target:
    return Target(APNS_CHANNEL, token, None, b"\x02" * 32)


def public_key() -> ec.EllipticCurvePublicKey:
    return keys.apns_key().public_key()


def verified_claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, public_key(), algorithms=["ES256"])
    return claims


# --------------------------------------------------------------------------- the request


async def test_request_headers_body_and_token(fake: FakeApns, provider: ApnsProvider) -> None:
    outcome = await provider.send(apns_push(hint(), device("ok.wire")))

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = fake.requests
    assert request.header(":method") == "POST"
    assert request.header(":scheme") == "https"
    assert request.header(":path") == "/3/device/ok.wire"
    assert request.header("apns-topic") == BUNDLE_ID
    assert request.header("apns-push-type") == "background"
    assert request.header("apns-priority") == "5"
    assert request.header("apns-collapse-id") == TOPIC_B64
    assert request.header("apns-expiration") is None
    assert request.json() == {
        "aps": {"content-available": 1},
        "topic": TOPIC_B64,
        "sequence_id": "18446744073709551615",
    }
    # Token auth: bearer <ES256 JWT>, kid = key id, iss = team id, iat = now; nothing else.
    assert (request.header("authorization") or "").startswith("bearer ")
    header = jwt.get_unverified_header(request.jwt)
    assert header["alg"] == "ES256" and header["kid"] == KEY_ID
    claims = verified_claims(request.jwt)
    assert claims["iss"] == TEAM_ID
    assert abs(claims["iat"] - time.time()) < 60
    assert set(claims) == {"iss", "iat"}


async def test_a_push_without_a_push_type_sends_no_header_on_the_wire(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    # In turn with pushes that carry one, on one connection: a header indexed by HPACK for an
    # earlier request must not come back on a request that leaves it out.
    body = b'{"aps":{"alert":"hi"}}'
    bare = Push("ok.bare", body, PushKind.ALERT, Priority.HIGH, extras=ApnsExtras(push_type_from_kind=False))
    voip = Push("ok.voip", body, PushKind.ALERT, Priority.HIGH, extras=ApnsExtras(push_type="voip"))
    pushes = [apns_push(hint(), device("ok.kind")), bare, voip, bare, apns_push(hint(), device("ok.kind"))]
    for push in pushes:
        assert (await provider.send(push)).kind is OutcomeKind.DELIVERED

    sent = [
        (r.token, [value for name, value in r.headers if name == "apns-push-type"]) for r in fake.requests
    ]
    assert sent == [
        ("ok.kind", ["background"]),  # the XMTP path: the push's kind, always
        ("ok.bare", []),
        ("ok.voip", ["voip"]),
        ("ok.bare", []),
        ("ok.kind", ["background"]),
    ]
    assert len({r.connection for r in fake.requests}) == 1
    assert all(r.header("apns-priority") == "10" for r in fake.requests[1:4])  # the rest still sent


async def test_every_request_has_its_own_canonical_apns_id(fake: FakeApns, provider: ApnsProvider) -> None:
    await asyncio.gather(*(provider.send(apns_push(hint(), device(f"ok.id{n}"))) for n in range(20)))
    ids = [request.header("apns-id") or "" for request in fake.requests]
    assert len(ids) == 20 and len(set(ids)) == 20
    for apns_id in ids:
        assert str(uuid.UUID(apns_id)) == apns_id  # canonical: lowercase 8-4-4-4-12 hex
        assert uuid.UUID(apns_id).variant == uuid.RFC_4122


async def test_collapse_id_over_64_bytes_is_refused_without_a_request(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    long_topic = b"\x00" + b"t" * 60  # base64 is 84 characters
    outcome = await provider.send(apns_push(hint(topic=long_topic), device("ok.long")))
    assert outcome.kind is OutcomeKind.REJECTED
    assert fake.requests == []


async def test_one_jwt_for_many_requests_and_several_connections(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    # The server allows 40 streams per connection (Apple: 1000) and holds every answer until 150
    # requests arrived, so the pool has to open more connections while the first is full.
    fake.max_concurrent_streams = 40
    fake.hold_until = 150
    outcomes = await asyncio.gather(
        *(provider.send(apns_push(hint(i), device(f"ok.c{i}"))) for i in range(150))
    )
    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    fake.hold_until = 0
    for i in range(5):  # and later requests keep presenting it
        assert (await provider.send(apns_push(hint(i), device(f"ok.later{i}")))).kind is OutcomeKind.DELIVERED

    assert len({r.connection for r in fake.requests}) >= 2
    tokens = {r.jwt for r in fake.requests}
    assert len(tokens) == 1, f"{len(tokens)} provider tokens for one key"
    verified_claims(tokens.pop())


async def test_a_new_connection_carries_no_more_streams_than_the_server_allows(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    # The server's SETTINGS (40 streams) reach the client 0.1 s after TLS is up, and it holds every
    # answer until 150 requests arrived: a pool that used the connection at once would put all 150
    # on it, beyond the server's limit.
    fake.max_concurrent_streams = 40
    fake.preface_delay = 0.1
    fake.hold_until = 150
    outcomes = await asyncio.gather(
        *(provider.send(apns_push(hint(i), device(f"ok.p{i}"))) for i in range(150))
    )
    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    per_connection = Counter(r.connection for r in fake.requests)
    assert len(per_connection) >= 4 and max(per_connection.values()) <= 40, per_connection


async def test_a_burst_of_large_bodies_waits_for_the_servers_flow_control_credit(fake: FakeApns) -> None:
    # 150 bodies of 4,000 bytes on one connection are 600 kB against its first 64 KiB of credit,
    # all written before the server has read any: each must wait for the server's WINDOW_UPDATEs
    # (aioapns would raise, sleep a second and give the push up, its stream half sent).
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=10.0, max_connections=1)
    bodies = [b'{"aps":{"content-available":1},"m":"' + b"%04d" % i + b"x" * 3958 + b'"}' for i in range(150)]
    assert {len(body) for body in bodies} == {4000}
    try:
        outcomes = await asyncio.gather(*(apns.send(Push(f"ok.w{i}", body)) for i, body in enumerate(bodies)))
    finally:
        await apns.close()
    assert [o.kind for o in outcomes] == [OutcomeKind.DELIVERED] * 150, Counter(o.reason for o in outcomes)
    assert sorted(r.body for r in fake.requests) == sorted(bodies)  # each whole, once


async def test_a_stream_the_server_resets_fails_at_once_and_gives_its_slot_back(fake: FakeApns) -> None:
    # The server allows 10 streams and resets every request whose body passes 1,000 bytes (as it may
    # refuse a stream at any time), some while their bodies still wait for credit: each fails at once,
    # none raises, and the 10 slots are free again for the pushes after them.
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=30.0, max_connections=1)
    fake.max_concurrent_streams = 10
    fake.reset_over = 1000
    try:
        started = time.monotonic()
        refused = await asyncio.gather(*(apns.send(Push(f"ok.r{i}", b"{}" + b" " * 3998)) for i in range(60)))
        refused_in = time.monotonic() - started
        fake.reset_over = 0
        later = await asyncio.gather(*(apns.send(Push(f"ok.l{i}", b"{}")) for i in range(20)))
    finally:
        await apns.close()
    assert {o.kind for o in refused} == {OutcomeKind.FAILED}, Counter(o.reason for o in refused)
    assert refused_in < 15, refused_in  # not at the 30 s deadline
    assert {o.kind for o in later} == {OutcomeKind.DELIVERED}, Counter(o.reason for o in later)
    assert len(fake.requests) == 20 and len({r.connection for r in fake.requests}) == 1


async def test_expired_provider_token_is_renewed_once_and_resent(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    outcome = await provider.send(apns_push(hint(), device("expired-once.a")))

    assert outcome.kind is OutcomeKind.DELIVERED
    first, second = fake.requests_for("expired-once.a")
    assert first.jwt != second.jwt
    assert verified_claims(second.jwt)["iss"] == TEAM_ID
    assert second.json() == first.json()
    # The renewed token is the one kept for what follows.
    await provider.send(apns_push(hint(), device("ok.after")))
    assert fake.requests_for("ok.after")[0].jwt == second.jwt


async def test_expired_provider_token_twice_is_not_resent_again(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    expired = Reply(403, "ExpiredProviderToken")
    fake.script("twice", expired, expired, Reply(200))
    outcome = await provider.send(apns_push(hint(), device("twice")))
    assert outcome.kind is OutcomeKind.REJECTED
    assert len(fake.requests_for("twice")) == 2


async def test_a_burst_of_expired_answers_renews_the_token_once(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    await provider.send(apns_push(hint(), device("ok.first")))
    stale = fake.requests[0].jwt
    fake.expire_jwt(stale)  # Apple now refuses that token, whoever presents it

    outcomes = await asyncio.gather(
        *(provider.send(apns_push(hint(i), device(f"ok.burst{i}"))) for i in range(50))
    )

    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    renewed = {r.jwt for r in fake.requests if r.jwt != stale}
    # Apple answers TooManyProviderTokenUpdates to a provider that keeps minting tokens.
    assert len(renewed) == 1, f"{len(renewed)} new tokens for one expiry"


def test_shared_token_is_renewed_before_it_is_an_hour_old() -> None:
    now = [1_800_000_000.0]
    token = SharedToken(keys.apns_key_pem(), KEY_ID, TEAM_ID, clock=lambda: now[0])
    first = token.get_header()
    now[0] += 49 * 60
    assert token.get_header() == first  # reused, not regenerated
    now[0] += 2 * 60  # 51 minutes old: Apple refuses it at 60
    renewed = token.get_header()
    assert renewed != first
    claims = jwt.decode(renewed.split()[1], public_key(), algorithms=["ES256"], options={"verify_iat": False})
    assert claims["iat"] == int(now[0])


# --------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("ok", OutcomeKind.DELIVERED),
        ("gone", OutcomeKind.DEAD),  # 410 Unregistered
        ("expiredtoken", OutcomeKind.DEAD),  # 410 ExpiredToken
        ("bad", OutcomeKind.MISMATCH),  # 400 BadDeviceToken
        ("topic", OutcomeKind.MISMATCH),  # 400 DeviceTokenNotForTopic
        ("busy", OutcomeKind.FAILED),  # 429
        ("err", OutcomeKind.FAILED),  # 500
        ("unavailable", OutcomeKind.FAILED),  # 503
        ("forbidden", OutcomeKind.REJECTED),  # 403 InvalidProviderToken
        ("badtopic", OutcomeKind.REJECTED),  # 400, another reason
        ("toolarge", OutcomeKind.REJECTED),  # 413
    ],
)
async def test_outcome_table(
    fake: FakeApns, provider: ApnsProvider, token: str, expected: OutcomeKind
) -> None:
    outcome = await provider.send(apns_push(hint(), device(f"{token}.t")))
    assert outcome.kind is expected
    assert outcome.delay_seconds is None and not outcome.pause_channel
    assert len(fake.requests) == 1  # one attempt: retries go through our queue


@pytest.mark.parametrize("status", [405, 404, 401, 409])
async def test_other_4xx_is_rejected(fake: FakeApns, provider: ApnsProvider, status: int) -> None:
    fake.script("other4xx", Reply(status, "SomethingElse"))
    assert (await provider.send(apns_push(hint(), device("other4xx")))).kind is OutcomeKind.REJECTED


async def test_many_error_answers_on_one_connection_all_resolve(fake: FakeApns) -> None:
    # Each error answer's JSON body takes flow-control credit from the client's connection window
    # (64 KiB); a client that never gives it back stalls after that many bytes of error bodies
    # (about 1,300 real 410 bodies). Long reasons make the window run out within 60 answers here.
    fake.script("gone", Reply(410, "Unregistered" + " " * 2000))
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=3.0, max_connections=1)
    try:
        outcomes = await asyncio.gather(
            *(apns.send(apns_push(hint(i), device(f"gone.{i}"))) for i in range(120))
        )
    finally:
        await apns.close()
    assert [o.kind for o in outcomes] == [OutcomeKind.DEAD] * 120
    assert len({r.connection for r in fake.requests}) == 1


@pytest.mark.slow
async def test_padded_error_answers_on_one_connection_all_resolve(fake: FakeApns) -> None:
    # Padding takes window like the body (RFC 9113 section 6.1). A client that gives back only the
    # body's length loses 256 bytes of its 64 KiB connection window per answer here: it stalls after
    # about 250 answers, and every later request on the connection times out.
    fake.pad_length = 255
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=5.0, max_connections=1)
    try:
        for wave in range(15):  # 200 at once: each wave well within the timeout on a busy host
            numbers = range(wave * 200, (wave + 1) * 200)
            outcomes = await asyncio.gather(
                *(apns.send(apns_push(hint(i), device(f"gone.p{i}"))) for i in numbers)
            )
            assert Counter(o.kind for o in outcomes) == {OutcomeKind.DEAD: 200}, f"wave {wave}"
    finally:
        await apns.close()
    assert len(fake.requests) == 3000
    assert len({r.connection for r in fake.requests}) == 1


async def test_delivered_requests_leave_no_bookkeeping_behind(fake: FakeApns, provider: ApnsProvider) -> None:
    for i in range(20):
        await provider.send(apns_push(hint(i), device(f"ok.b{i}")))
    await provider.send(apns_push(hint(), device("gone.b")))
    # aioapns 4.0 internals (the version is pinned): per-request tables of the connection.
    [connection] = provider._pool.connections
    assert connection.requests == {} and connection.request_statuses == {}
    assert connection.request_streams == {}
    # h2 4.x internals: the closed streams a connection remembers are bounded far below h2's 65,536.
    closed = connection.conn._closed_streams
    assert len(closed) >= 20 and closed._size_limit == CLOSED_STREAMS_KEPT == 8192


# --------------------------------------------------------------------------- time and connection trouble


async def test_timeout_bounds_a_server_that_never_answers(fake: FakeApns) -> None:
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=0.3)
    try:
        # Connected first: a handshake eating the 0.3 s would leave no streams to reset.
        assert (await apns.send(apns_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(apns.send(apns_push(hint(i), device(f"slow.{i}"))) for i in range(20))
        )
        elapsed = time.monotonic() - started
        assert [o.kind for o in outcomes] == [OutcomeKind.FAILED] * 20
        assert elapsed < 2.0
        # The abandoned streams are reset (their slots are free again) and the connection still works.
        for _ in range(300):  # up to 3 s for the RST_STREAM frames to come in
            if len(fake.resets) >= 20:
                break
            await asyncio.sleep(0.01)
        assert fake.resets == [8] * 20  # RST_STREAM CANCEL
        assert (await apns.send(apns_push(hint(), device("ok.after-timeout")))).kind is OutcomeKind.DELIVERED
    finally:
        await apns.close()


@pytest.mark.slow
async def test_an_answer_after_the_timeout_harms_no_other_request(fake: FakeApns) -> None:
    credentials = apns_credentials(apns_settings(fake))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=1.0)
    fake.script("late", Reply(410, "Unregistered", held=True))
    fake.script("steady", Reply(200, held=True))
    try:
        assert (await apns.send(apns_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
        late = asyncio.ensure_future(apns.send(apns_push(hint(), device("late"))))
        await asyncio.sleep(0.5)
        steady = asyncio.ensure_future(apns.send(apns_push(hint(), device("steady"))))
        assert (await late).kind is OutcomeKind.FAILED  # given up after 1 s
        fake.release()  # the late answer arrives now, while `steady` is in flight on the same connection
        assert (await steady).kind is OutcomeKind.DELIVERED
        assert (await apns.send(apns_push(hint(), device("ok.still")))).kind is OutcomeKind.DELIVERED
        assert len({r.connection for r in fake.requests}) == 1
    finally:
        await apns.close()


@pytest.mark.slow
async def test_connection_refused_is_transient(tls: TlsFiles) -> None:
    stopped = FakeApns(tls).start()
    endpoint = stopped.endpoint
    stopped.stop()  # nothing listens on that port any more
    settings = make_settings(NO_DATABASE, apns_endpoint=endpoint, apns_ca_file=tls.ca_file)
    credentials = apns_credentials(settings)
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=2.0)
    try:
        started = time.monotonic()
        assert (await apns.send(apns_push(hint(), device("ok.refused")))).kind is OutcomeKind.FAILED
        assert time.monotonic() - started < 2.5
    finally:
        await apns.close()


async def test_connection_lost_mid_request_is_transient(fake: FakeApns, provider: ApnsProvider) -> None:
    fake.script("hang", Reply(200, silent=True))
    pending = asyncio.ensure_future(provider.send(apns_push(hint(), device("hang"))))
    await fake.wait_for(1)
    fake.drop_connections()
    assert (await asyncio.wait_for(pending, 3)).kind is OutcomeKind.FAILED
    # A new connection is made for the next send.
    assert (await provider.send(apns_push(hint(), device("ok.reconnected")))).kind is OutcomeKind.DELIVERED


@pytest.mark.slow
async def test_a_connection_is_kept_while_used_and_closed_once_idle(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    # aioapns closes a connection INACTIVITY_TIME after its last write (10 s); shortened here, on this
    # pool's own protocol class.
    provider._pool.protocol_class.INACTIVITY_TIME = 1.0
    opened = fake.connections  # the fake counts every connection since it started
    for i in range(6):  # a push every 0.2 s for 1.2 s: never idle for 1 s
        assert (await provider.send(apns_push(hint(i), device(f"ok.busy{i}")))).kind is OutcomeKind.DELIVERED
        await asyncio.sleep(0.2)
    assert fake.connections == opened + 1 and len(provider._pool.connections) == 1
    idle_since = time.monotonic()
    while provider._pool.connections:  # idle past 1 s: closed, and the pool lets it go
        assert time.monotonic() - idle_since < 5.0, "an idle connection was kept"
        await asyncio.sleep(0.02)
    assert (await provider.send(apns_push(hint(), device("ok.after-idle")))).kind is OutcomeKind.DELIVERED
    assert fake.connections == opened + 2


async def test_pushes_started_together_all_arrive_and_each_answer_reaches_its_own(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    # Requests started in one loop iteration leave in one write; every answer still finds its push.
    fake.script("gone.together", Reply(410, "Unregistered"))
    tokens = [f"ok.together{i}" for i in range(40)] + ["gone.together"]
    outcomes = await asyncio.gather(
        *(provider.send(apns_push(hint(i), device(t))) for i, t in enumerate(tokens))
    )
    assert [o.kind for o in outcomes] == [OutcomeKind.DELIVERED] * 40 + [OutcomeKind.DEAD]
    assert sorted(r.token for r in fake.requests) == sorted(tokens)


@pytest.mark.slow
async def test_untrusted_server_certificate_is_transient(fake: FakeApns, tmp_path: Path) -> None:
    other = make_tls_files(tmp_path / "other-ca")  # a CA that did not sign the fake's certificate
    credentials = apns_credentials(
        make_settings(NO_DATABASE, apns_endpoint=fake.endpoint, apns_ca_file=other.ca_file)
    )
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=2.0)
    try:
        assert (await apns.send(apns_push(hint(), device("ok.untrusted")))).kind is OutcomeKind.FAILED
    finally:
        await apns.close()
    assert fake.requests == []


# --------------------------------------------------------------------------- start-up validation


def _pem(key: Any) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@pytest.mark.parametrize(
    "key",
    [
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
        _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        _pem(ec.generate_private_key(ec.SECP384R1())),
        "/nonexistent/AuthKey_KEYID12345.p8",
    ],
    ids=["bad-pem", "rsa", "p384", "missing-path"],
)
def test_unusable_key_stops_start_up_naming_the_setting(key: str) -> None:
    with pytest.raises(SettingsError) as raised:
        apns_credentials(make_settings(NO_DATABASE, apns_key=key))
    message = str(raised.value)
    assert message.startswith("XMTP_PUSH_APNS_KEY")
    assert "BEGIN" not in message and "nonexistent" not in message  # never the value itself


def test_missing_ca_file_stops_start_up() -> None:
    with pytest.raises(SettingsError, match=r"^XMTP_PUSH_APNS_CA_FILE"):
        apns_credentials(make_settings(NO_DATABASE, apns_ca_file="/nonexistent/ca.pem"))


def test_apple_hosts_by_environment() -> None:
    production = apns_credentials(make_settings(NO_DATABASE))
    sandbox = apns_credentials(make_settings(NO_DATABASE, apns_environment="sandbox"))
    assert production is not None and production.endpoint == "https://api.push.apple.com"
    assert sandbox is not None and sandbox.endpoint == "https://api.sandbox.push.apple.com"


async def test_key_given_as_a_file_path(fake: FakeApns, tmp_path: Path) -> None:
    path = tmp_path / "AuthKey_KEYID12345.p8"
    path.write_text(keys.apns_key_pem())
    credentials = apns_credentials(apns_settings(fake, apns_key=str(path)))
    assert credentials is not None
    apns = ApnsProvider(credentials, timeout_seconds=5.0)
    try:
        assert (await apns.send(apns_push(hint(), device("ok.path")))).kind is OutcomeKind.DELIVERED
    finally:
        await apns.close()
    verified_claims(fake.requests[0].jwt)


# --------------------------------------------------------------------------- health


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_credentials_refused_then_accepted_and_the_connection_gauges(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    labels = {"channel": "apns", "app": "default"}
    refused = sample("xmtp_push_credentials_refused_total", **labels)
    connects = sample("xmtp_push_provider_connects_total", **labels)
    assert sample("xmtp_push_credentials_ok", **labels) == 1  # not judged yet: not known bad

    assert (await provider.send(apns_push(hint(), device("forbidden.h1")))).kind is OutcomeKind.REJECTED
    assert sample("xmtp_push_credentials_refused_total", **labels) == refused + 1
    assert sample("xmtp_push_credentials_ok", **labels) == 0
    # A push Apple judged on its own (a gone token) tells that the credentials were taken.
    assert (await provider.send(apns_push(hint(), device("gone.h1")))).kind is OutcomeKind.DEAD
    assert sample("xmtp_push_credentials_ok", **labels) == 1
    assert sample("xmtp_push_credentials_refused_total", **labels) == refused + 1

    provider.sample_gauges()
    assert sample("xmtp_push_provider_connects_total", **labels) == connects + 1
    assert sample("xmtp_push_provider_connections", **labels) == 1
    assert sample("xmtp_push_provider_connections_in_use", **labels) == 0
    unanswered = asyncio.create_task(provider.send(apns_push(hint(), device("slow.h1"))))
    try:
        for _ in range(300):  # until the request is on the wire and waits for its answer
            provider.sample_gauges()
            if sample("xmtp_push_provider_connections_in_use", **labels) == 1:
                break
            await asyncio.sleep(0.01)
        assert sample("xmtp_push_provider_connections_in_use", **labels) == 1
    finally:
        unanswered.cancel()
        await asyncio.gather(unanswered, return_exceptions=True)
    assert 0 <= sample("xmtp_push_apns_token_age_seconds", app="default") < 5
