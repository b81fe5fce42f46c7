"""The FCM channel on the wire: FcmProvider (firebase-admin underneath) against a local FCM.

Nothing of ours is replaced: the provider, firebase-admin, google-auth and httpx run for real; only
Google's two endpoints (OAuth token, FCM v1 send) are the fake in fakes/fake_fcm.py.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from prometheus_client import REGISTRY

from app.core.config import SettingsError
from app.delivery.credentials import apns_credentials, fcm_credentials
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import FcmProvider
from app.delivery.types import OutcomeKind
from app.fanout.hints import apns_push, fcm_push
from app.recipients.types import Target
from fakes import keys
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm, Reply
from tests.support import frozen_heap, make_settings
from tests.support.fcm import NO_DATABASE, TOPIC, device, fcm_settings, hint, new_provider

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
TOPIC_B64 = base64.b64encode(TOPIC).decode()


@pytest.fixture
def fake(fcm_server: FakeFcm) -> FakeFcm:
    fcm_server.reset()
    return fcm_server


@pytest.fixture(scope="module")
async def shared(fcm_server: FakeFcm) -> AsyncIterator[FcmProvider]:
    fcm = new_provider(fcm_server)
    yield fcm
    await fcm.close()


@pytest.fixture
def provider(fake: FakeFcm, shared: FcmProvider) -> FcmProvider:
    """One provider for the tests that do not care about its access token (building one is slow)."""
    return shared


@pytest.fixture
async def fresh(fake: FakeFcm) -> AsyncIterator[FcmProvider]:
    """A provider of its own: no access token yet."""
    fcm = new_provider(fake)
    yield fcm
    await fcm.close()


# --------------------------------------------------------------------------- the request


async def test_request_path_auth_and_exact_body(fake: FakeFcm, provider: FcmProvider) -> None:
    outcome = await provider.send(fcm_push(hint(), device("ok.wire")))

    assert outcome.kind is OutcomeKind.DELIVERED
    [request] = fake.requests
    assert request.path == "/v1/projects/test-project/messages:send"
    assert request.headers["authorization"] == "Bearer test-token"
    assert request.headers["content-type"].startswith("application/json")
    assert request.json() == {
        "message": {
            "token": "ok.wire",
            "data": {"topic": TOPIC_B64, "sequence_id": "9007199254740993"},
            "android": {"priority": "HIGH"},
            "apns": {
                "headers": {"apns-priority": "5", "apns-push-type": "background"},
                "payload": {"aps": {"content-available": 1}},
            },
        }
    }


async def test_access_token_comes_from_the_service_accounts_token_uri(
    fake: FakeFcm, fresh: FcmProvider
) -> None:
    for i in range(5):
        assert (await fresh.send(fcm_push(hint(i), device(f"ok.{i}")))).kind is OutcomeKind.DELIVERED

    [token_request] = fake.token_requests  # fetched once, reused
    assert token_request.form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    account = json.loads(keys.service_account(token_uri=fake.token_uri))
    # google-auth names Google's token endpoint as the audience whatever token_uri says.
    claims = jwt.decode(
        token_request.assertion,
        keys.fcm_key().public_key(),
        algorithms=["RS256"],
        audience="https://oauth2.googleapis.com/token",
    )
    assert claims["iss"] == account["client_email"]
    assert abs(claims["iat"] - time.time()) < 60
    assert FCM_SCOPE in claims["scope"].split()
    assert jwt.get_unverified_header(token_request.assertion)["kid"] == account["private_key_id"]


async def test_concurrent_sends_share_one_access_token(fake: FakeFcm, fresh: FcmProvider) -> None:
    fake.token_delay = 0.2
    outcomes = await asyncio.gather(*(fresh.send(fcm_push(hint(i), device(f"ok.c{i}"))) for i in range(50)))
    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    assert len(fake.token_requests) == 1
    assert {r.headers["authorization"] for r in fake.requests} == {"Bearer test-token"}


@pytest.mark.slow
async def test_a_slow_token_endpoint_does_not_stall_the_event_loop(fake: FakeFcm, fresh: FcmProvider) -> None:
    # google-auth fetches the token with a blocking call; the worker's other channels share the loop.
    fake.token_delay = 2.0  # the loop standing still for it would show as a 2 s gap
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    try:
        assert (await fresh.send(fcm_push(hint(), device("ok.slow-token")))).kind is OutcomeKind.DELIVERED
    finally:
        ticking.cancel()
    assert max(gaps) < 1.0, f"the event loop stood still for {max(gaps):.2f} s"


async def test_two_projects_of_one_service_account_each_get_their_own_pushes(fake: FakeFcm) -> None:
    # Two Matrix apps may share a service-account file and name two projects: each pushes to its own,
    # and a project FCM refuses the account (not known to the fake here) stays refused.
    credentials = fcm_credentials(fcm_settings(fake))
    assert credentials is not None and credentials.project_id == "test-project"
    fake.projects = {"test-project"}
    own, other = (
        FcmProvider(dataclasses.replace(credentials, project_id=project), timeout_seconds=5.0)
        for project in ("test-project", "other-project")
    )
    try:
        assert (await other.send(fcm_push(hint(), device("ok.other")))).kind is OutcomeKind.REJECTED
        assert (await own.send(fcm_push(hint(), device("ok.own")))).kind is OutcomeKind.DELIVERED
    finally:
        await own.close()
        await other.close()
    paths = {r.token: r.path for r in fake.requests}
    assert paths == {
        "ok.other": "/v1/projects/other-project/messages:send",
        "ok.own": "/v1/projects/test-project/messages:send",
    }


@pytest.mark.filterwarnings("error")
async def test_no_deprecation_warning_escapes(fake: FakeFcm) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fcm = new_provider(fake)
        try:
            assert (await fcm.send(fcm_push(hint(), device("ok.warnings")))).kind is OutcomeKind.DELIVERED
        finally:
            await fcm.close()


# --------------------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("ok", OutcomeKind.DELIVERED),
        ("gone", OutcomeKind.DEAD),  # 404 UNREGISTERED
        ("mismatch", OutcomeKind.MISMATCH),  # 403 SENDER_ID_MISMATCH
        ("unavailable", OutcomeKind.FAILED),  # 503 UNAVAILABLE
        ("internal", OutcomeKind.FAILED),  # 500 INTERNAL
        ("invalid", OutcomeKind.REJECTED),  # 400 INVALID_ARGUMENT
        ("denied", OutcomeKind.REJECTED),  # 403 PERMISSION_DENIED, no FCM code
    ],
)
async def test_outcome_table(fake: FakeFcm, provider: FcmProvider, token: str, expected: OutcomeKind) -> None:
    outcome = await provider.send(fcm_push(hint(), device(f"{token}.t")))
    assert outcome.kind is expected
    assert outcome.delay_seconds is None and not outcome.pause_channel
    assert len(fake.requests) == 1  # firebase-admin's own retries are off: ours go through the queue


@pytest.mark.parametrize("name", [None, "UNAVAILABLE", "INTERNAL"])
async def test_a_403_is_rejected_whatever_status_its_body_names(
    fake: FakeFcm, provider: FcmProvider, name: str | None
) -> None:
    fake.script("refused", Reply(403, name))
    outcome = await provider.send(fcm_push(hint(), device("refused.t")))
    assert outcome.kind is OutcomeKind.REJECTED  # not retried
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("status", "name"), [(503, "UNAVAILABLE"), (500, "INTERNAL"), (502, None), (504, None)]
)
async def test_server_errors_get_exactly_one_request(
    fake: FakeFcm, provider: FcmProvider, status: int, name: str | None
) -> None:
    fake.script("flaky", Reply(status, name, name))
    outcome = await provider.send(fcm_push(hint(), device("flaky")))
    await asyncio.sleep(0.2)  # a library retry would have come by now
    assert len(fake.requests) == 1
    if status in (500, 503):
        assert outcome.kind is OutcomeKind.FAILED


@pytest.mark.parametrize(
    ("retry_after", "delay", "given"),
    [
        ("5", 60.0, 5.0),
        ("120", 120.0, 120.0),
        ("1000", 300.0, 1000.0),
        (None, 60.0, None),
        ("soon", 60.0, None),
    ],
)
async def test_quota_exceeded_pauses_the_channel(
    fake: FakeFcm, provider: FcmProvider, retry_after: str | None, delay: float, given: float | None
) -> None:
    fake.script("quota", Reply(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", retry_after=retry_after))
    outcome = await provider.send(fcm_push(hint(), device("quota.t")))
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.delay_seconds == delay
    assert outcome.retry_after == given  # as FCM gave it, for the Matrix gateway's in-request retry
    assert outcome.pause_channel is True
    assert len(fake.requests) == 1


async def test_429_without_an_fcm_code_also_pauses(fake: FakeFcm, provider: FcmProvider) -> None:
    fake.script("busy", Reply(429, "RESOURCE_EXHAUSTED", retry_after="90"))
    outcome = await provider.send(fcm_push(hint(), device("busy")))
    assert (outcome.kind, outcome.delay_seconds, outcome.pause_channel) == (OutcomeKind.FAILED, 90.0, True)


async def test_timeout_bounds_a_slow_answer(fake: FakeFcm) -> None:
    fcm = new_provider(fake, timeout=0.5)
    try:
        await fcm.send(fcm_push(hint(), device("ok.warm")))  # the token fetch is not part of what is timed
        started = time.monotonic()
        outcome = await fcm.send(fcm_push(hint(), device("slow.t")))
        elapsed = time.monotonic() - started
    finally:
        await fcm.close()
    assert outcome.kind is OutcomeKind.FAILED
    assert elapsed < 2.0


async def test_connection_refused_is_transient(fake: FakeFcm) -> None:
    closed = FakeFcm().start()
    endpoint = closed.endpoint
    closed.stop()
    fcm = new_provider(fake, fcm_endpoint=endpoint)  # token from the live fake, sends to nothing
    try:
        assert (await fcm.send(fcm_push(hint(), device("ok.refused")))).kind is OutcomeKind.FAILED
    finally:
        await fcm.close()


@pytest.mark.parametrize("status", [500, 400])
async def test_token_endpoint_failure_is_transient(fake: FakeFcm, status: int) -> None:
    fake.token_status = status
    fcm = new_provider(fake, timeout=0.5)
    try:
        assert (await fcm.send(fcm_push(hint(), device("ok.no-token")))).kind is OutcomeKind.FAILED
    finally:
        await fcm.close()
    assert fake.requests == []  # nothing is sent without a token


# --------------------------------------------------------------------------- start-up validation


def _account(**changes: Any) -> dict[str, Any]:
    account: dict[str, Any] = json.loads(keys.service_account())
    account.update(changes)
    return {k: v for k, v in account.items() if v is not None}


@pytest.mark.parametrize(
    "value",
    [
        json.dumps(_account(project_id=None)),
        json.dumps(_account(project_id="")),
        json.dumps(_account(client_email=None)),
        json.dumps(_account(private_key=None)),
        json.dumps(_account(token_uri=None)),
        '{"type": "service_account", ',
        "[1, 2]",
        "/nonexistent/service-account.json",
    ],
    ids=[
        "no-project",
        "empty-project",
        "no-email",
        "no-key",
        "no-token-uri",
        "bad-json",
        "not-object",
        "missing",
    ],
)
def test_unusable_service_account_stops_start_up_naming_the_setting(value: str) -> None:
    with pytest.raises(SettingsError) as raised:
        fcm_credentials(make_settings(NO_DATABASE, fcm_service_account=value))
    message = str(raised.value)
    assert message.startswith("XMTP_PUSH_FCM_SERVICE_ACCOUNT")
    assert "PRIVATE KEY" not in message and "nonexistent" not in message


def test_not_configured_without_a_service_account() -> None:
    assert fcm_credentials(make_settings(NO_DATABASE, fcm_service_account=None)) is None


async def test_service_account_given_as_a_file_path(fake: FakeFcm, tmp_path: Path) -> None:
    path = tmp_path / "service-account.json"
    path.write_text(keys.service_account(token_uri=fake.token_uri))
    fcm = new_provider(fake, fcm_service_account=str(path))
    try:
        assert (await fcm.send(fcm_push(hint(), device("ok.file")))).kind is OutcomeKind.DELIVERED
    finally:
        await fcm.close()
    assert fake.requests[0].path == "/v1/projects/test-project/messages:send"


async def test_another_project_is_another_app(fake: FakeFcm) -> None:
    other = new_provider(
        fake, fcm_service_account=keys.service_account(fake.token_uri, project_id="other-project")
    )
    try:
        assert (await other.send(fcm_push(hint(), device("ok.other")))).kind is OutcomeKind.DELIVERED
    finally:
        await other.close()
    assert fake.requests[0].path == "/v1/projects/other-project/messages:send"


# --------------------------------------------------------------------------- health


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_token_fetches_are_counted_and_a_refused_account_is_told(fake: FakeFcm) -> None:
    ok, failed = ({"app": "default", "result": r} for r in ("ok", "failed"))
    labels = {"channel": "fcm", "app": "default"}
    before = (
        sample("xmtp_push_fcm_token_refreshes_total", **ok),
        sample("xmtp_push_fcm_token_refreshes_total", **failed),
    )
    refused = sample("xmtp_push_credentials_refused_total", **labels)

    fake.token_status = 400  # invalid_grant: the account is refused
    fcm = new_provider(fake, timeout=0.5)
    try:
        assert (await fcm.send(fcm_push(hint(), device("ok.h1")))).kind is OutcomeKind.FAILED
        assert sample("xmtp_push_fcm_token_refreshes_total", **failed) == before[1] + 1
        assert sample("xmtp_push_credentials_refused_total", **labels) == refused + 1
        assert sample("xmtp_push_credentials_ok", **labels) == 0

        fake.token_status = 200
        assert (await fcm.send(fcm_push(hint(), device("ok.h2")))).kind is OutcomeKind.DELIVERED
        assert sample("xmtp_push_fcm_token_refreshes_total", **ok) == before[0] + 1
        assert sample("xmtp_push_credentials_ok", **labels) == 1
    finally:
        await fcm.close()


# --------------------------------------------------------------------------- a token refused within its life


class LoopLag:
    """The longest the event loop kept a 10 ms ticker waiting past its time, while in the block.

    The test session's heap is frozen meanwhile (as the product freezes its start-up objects), so a
    full garbage collection of a long pytest run's objects is not taken for a blocking call."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._ticking: asyncio.Task[None] | None = None
        self._frozen = frozen_heap()

    async def _tick(self) -> None:
        while True:
            due = time.monotonic() + 0.01
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - due)

    async def __aenter__(self) -> LoopLag:
        self._frozen.__enter__()
        self._ticking = asyncio.ensure_future(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._ticking is not None
        self._ticking.cancel()
        self._frozen.__exit__(None, None, None)


class ApnsTraffic:
    """Pushes to the fake APNs one after another while in the block: when each was answered."""

    def __init__(self, apns: FakeApns) -> None:
        credentials = apns_credentials(
            make_settings(NO_DATABASE, apns_endpoint=apns.endpoint, apns_ca_file=apns.tls.ca_file)
        )
        assert credentials is not None
        self.provider = ApnsProvider(credentials, timeout_seconds=5.0)
        self.answered: list[float] = []
        self._pushing: asyncio.Task[None] | None = None

    async def _push_one(self, i: int) -> None:
        target = Target(1, f"ok.flowing{i}", None, b"\x02" * 32)
        outcome = await self.provider.send(apns_push(hint(i), target))
        assert outcome.kind is OutcomeKind.DELIVERED
        self.answered.append(time.monotonic())

    async def _push(self) -> None:
        for i in itertools.count(1):
            await self._push_one(i)
            await asyncio.sleep(0.005)

    def longest_wait(self, since: float) -> float:
        times = [since, *(t for t in self.answered if t > since), time.monotonic()]
        return max(later - earlier for earlier, later in itertools.pairwise(times))

    async def __aenter__(self) -> ApnsTraffic:
        await self._push_one(0)  # the connection is up
        self._pushing = asyncio.ensure_future(self._push())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._pushing is not None
        self._pushing.cancel()
        if self._pushing.done() and not self._pushing.cancelled():
            self._pushing.result()  # a push that failed fails the test
        await self.provider.close()


@pytest.fixture
async def patient(fake: FakeFcm) -> AsyncIterator[FcmProvider]:
    """A provider of its own whose timeout (8 s) outlasts a token endpoint stalling for 5 s."""
    fcm = new_provider(fake, timeout=8.0)
    yield fcm
    await fcm.close()


@pytest.fixture
async def hasty(fake: FakeFcm) -> AsyncIterator[FcmProvider]:
    """A provider of its own with a 1 s timeout."""
    fcm = new_provider(fake, timeout=1.0)
    yield fcm
    await fcm.close()


@pytest.mark.slow
async def test_a_401_while_the_token_endpoint_stalls_freezes_no_channel(
    fake: FakeFcm, apns_server: FakeApns, patient: FcmProvider
) -> None:
    # firebase-admin's httpx auth flow answers a 401 by fetching a token with a blocking call, on
    # the event loop, with google-auth's 120 s timeout: every channel of the process stood still.
    assert (await patient.send(fcm_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
    fake.revoke_access_token()
    fake.token_delay = 5.0
    async with LoopLag() as lag, ApnsTraffic(apns_server) as apns:
        started = time.monotonic()
        outcome = await patient.send(fcm_push(hint(), device("ok.after-401")))
        elapsed = time.monotonic() - started
        apns_wait = apns.longest_wait(started)
        apns_answers = len([t for t in apns.answered if t > started])
    assert outcome.kind is OutcomeKind.DELIVERED
    assert elapsed > 4.5  # it did wait for the stalled token endpoint
    assert lag.worst < 0.5, f"the event loop stood still for {lag.worst:.3f} s"  # the fault: 1 s or more
    assert apns_wait < 1.0 and apns_answers > 20, (apns_wait, apns_answers)
    assert [r.headers["authorization"] for r in fake.requests_for("ok.after-401")] == [
        "Bearer test-token",
        "Bearer test-token-2",
    ]
    assert len(fake.token_requests) == 2


@pytest.mark.slow
async def test_a_401_whose_fresh_token_does_not_come_in_time_is_transient(
    fake: FakeFcm, hasty: FcmProvider
) -> None:
    assert (await hasty.send(fcm_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
    fake.revoke_access_token()
    fake.token_delay = 5.0
    async with LoopLag() as lag:
        started = time.monotonic()
        outcome = await hasty.send(fcm_push(hint(), device("ok.no-fresh-token")))
        elapsed = time.monotonic() - started
    assert (outcome.kind, outcome.credentials_refused) == (OutcomeKind.FAILED, False)
    assert elapsed < 2.5
    assert lag.worst < 0.5, f"the event loop stood still for {lag.worst:.3f} s"  # the fault: 1 s or more
    assert len(fake.requests_for("ok.no-fresh-token")) == 1


async def test_sends_refused_together_share_one_fresh_token(fake: FakeFcm, fresh: FcmProvider) -> None:
    assert (await fresh.send(fcm_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
    fake.revoke_access_token()
    fake.token_delay = 0.2
    outcomes = await asyncio.gather(*(fresh.send(fcm_push(hint(i), device(f"ok.r{i}"))) for i in range(20)))
    assert {o.kind for o in outcomes} == {OutcomeKind.DELIVERED}
    assert len(fake.token_requests) == 2  # the first token, and one fresh one for all twenty
    retried = [r for r in fake.requests if r.token.startswith("ok.r")]
    assert len(retried) == 40
    assert sorted({r.headers["authorization"] for r in retried}) == [
        "Bearer test-token",
        "Bearer test-token-2",
    ]


async def test_a_401_to_a_fresh_token_refuses_the_credentials(fake: FakeFcm, fresh: FcmProvider) -> None:
    assert (await fresh.send(fcm_push(hint(), device("ok.warm")))).kind is OutcomeKind.DELIVERED
    outcome = await fresh.send(fcm_push(hint(), device("unauthenticated.t")))
    assert (outcome.kind, outcome.credentials_refused) == (OutcomeKind.REJECTED, True)
    assert len(fake.requests_for("unauthenticated.t")) == 2  # sent once more with a fresh token, no further
    assert len(fake.token_requests) == 2
