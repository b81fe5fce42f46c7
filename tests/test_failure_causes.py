"""What a failed push met, in an operator's words (app/delivery/causes.py), and how APNs and FCM tell it
in their outcomes, against the local fakes at the wire."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest

from app.delivery.causes import DNS, REFUSED, TIMEOUT, TLS, connection_cause, http_cause
from app.delivery.credentials import apns_credentials
from app.delivery.providers.apns import ApnsProvider
from app.fanout.hints import apns_push, fcm_push
from app.recipients.types import Target
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support import make_settings
from tests.support.fcm import NO_DATABASE, device, hint, new_provider

APNS_CHANNEL = 1


def raised_from(error: BaseException, outer: type[Exception]) -> BaseException:
    """`outer` raised while handling `error`, as a client library wraps what the socket met."""
    try:
        try:
            raise error
        except BaseException as inner:
            raise outer("wrapped") from inner
    except Exception as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (socket.gaierror(-2, "Name or service not known"), DNS),
        (ConnectionRefusedError(111, "Connection refused"), REFUSED),
        (ssl.SSLCertVerificationError("certificate verify failed"), TLS),
        (TimeoutError(), TIMEOUT),
    ],
)
def test_a_connection_cause_is_found_along_the_chain(error: BaseException, cause: str) -> None:
    assert connection_cause(error) == cause
    assert connection_cause(raised_from(error, httpx.ConnectError)) == cause
    assert connection_cause(RuntimeError("no cause")) == "the connection failed (RuntimeError)"


def test_a_provider_code_is_told_only_when_it_is_a_code() -> None:
    assert http_cause(400, "BadDeviceToken") == "HTTP 400 BadDeviceToken"
    assert http_cause("429", "QUOTA_EXCEEDED") == "HTTP 429 QUOTA_EXCEEDED"
    assert http_cause(400, "token abc/def is bad") == "HTTP 400"  # free text could quote what was sent
    assert http_cause(503) == "HTTP 503"


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("ok", ""),
        ("bad", "HTTP 400 BadDeviceToken"),
        ("gone", "HTTP 410 Unregistered"),
        ("busy", "HTTP 429 TooManyRequests"),
        ("forbidden", "credentials refused (HTTP 403 InvalidProviderToken)"),
    ],
)
async def test_an_apns_outcome_says_the_status_and_reason(
    apns_server: FakeApns, token: str, reason: str
) -> None:
    apns_server.reset()
    settings = make_settings(
        NO_DATABASE, apns_endpoint=apns_server.endpoint, apns_ca_file=apns_server.tls.ca_file
    )
    credentials = apns_credentials(settings)
    assert credentials is not None
    provider = ApnsProvider(credentials, timeout_seconds=5.0)
    target = Target(APNS_CHANNEL, f"{token}.cause", None, b"\x02" * 32)
    try:
        assert (await provider.send(apns_push(hint(), target))).reason == reason
    finally:
        await provider.close()
    assert apns_server.failures == []


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("ok", ""),
        ("gone", "HTTP 404 UNREGISTERED"),
        ("quota", "HTTP 429 QUOTA_EXCEEDED"),
        ("unavailable", "HTTP 503 UNAVAILABLE"),
        ("mismatch", "credentials refused (HTTP 403 SENDER_ID_MISMATCH)"),
        ("denied", "credentials refused (HTTP 403 PERMISSION_DENIED)"),
    ],
)
async def test_an_fcm_outcome_says_the_status_and_code(fcm_server: FakeFcm, token: str, reason: str) -> None:
    fcm_server.reset()
    provider = new_provider(fcm_server)
    try:
        assert (await provider.send(fcm_push(hint(), device(f"{token}.cause")))).reason == reason
    finally:
        await provider.close()


async def test_fcm_tells_a_refused_connection_and_a_refused_account(fcm_server: FakeFcm) -> None:
    fcm_server.reset()
    closed = FakeFcm().start()
    endpoint = closed.endpoint
    closed.stop()
    nowhere = new_provider(fcm_server, fcm_endpoint=endpoint)
    try:
        assert (await nowhere.send(fcm_push(hint(), device("ok.refused")))).reason == REFUSED
    finally:
        await nowhere.close()
    fcm_server.token_status = 400  # invalid_grant
    refused = new_provider(fcm_server, timeout=0.5)
    try:
        outcome = await refused.send(fcm_push(hint(), device("ok.no-token")))
    finally:
        await refused.close()
    assert outcome.reason == "credentials refused (by the OAuth token endpoint)"
