"""Caller authentication over both transports (docs/callers.md#who-may-call): each rule is a call made
over gRPC and over Connect, answered with the contract's code and message, counted by reason. The
calls carry a body that does not decode: a call that passes authentication is refused by the method
(INVALID_ARGUMENT), so the answer tells which stage decided."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from tests.support import Api, make_settings, running
from tests.support.auth import ALGORITHMS, API_KEY, claims, inline_keys, signing_key
from tests.support.auth_calls import Answer, connect_call, connect_status, grpc_call

KEYS = [signing_key(alg) for alg in ALGORITHMS]
TWIN = signing_key("RS256", "rs256-twin", number=1)  # a second RS256 key: a kid-less RS256 token has two
STRANGER = signing_key("ES256", "es256-0", number=2)  # the kid of a served key, another key's signature
AUDIENCE, ISSUER, SCOPE = "push.example", "https://issuer.example", "notify"
ADMITTED = ("INVALID_ARGUMENT", "request is malformed")
MESSAGES = {
    "missing": "missing bearer token",
    "header": "authorization header is not a bearer token",
    "malformed": "token is not a supported JWT",
    "unsupported_alg": "token is not a supported JWT",
    "untrusted": "token signature is not trusted",
    "expired": "token has expired",
    "not_yet_valid": "token is not yet valid",
    "audience": "token audience is not allowed",
    "issuer": "token issuer is not allowed",
    "scope": "token is missing a required scope",
}


def good(**changes: object) -> dict[str, object]:
    """Claims every check admits, with `changes` (a None drops the claim)."""
    values = {**claims(aud=AUDIENCE, iss=ISSUER, scope=f"read {SCOPE}"), **changes}
    return {name: value for name, value in values.items() if value is not None}


@pytest.fixture(scope="module")
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    settings = make_settings(
        sqlite_url,
        auth_enabled=True,
        auth_api_keys={"worker": API_KEY, "other": "o" * 64},
        auth_keys=inline_keys(*KEYS, TWIN),
        auth_audiences=AUDIENCE,
        auth_issuers=ISSUER,
        auth_required_scopes=SCOPE,
        auth_leeway_seconds=30,
    )
    async with running(settings) as started:
        yield started


def rejections(reason: str) -> float:
    return REGISTRY.get_sample_value("xmtp_push_auth_rejections_total", {"reason": reason}) or 0.0


async def both(api: Api, values: list[str]) -> tuple[Answer, Answer]:
    return await grpc_call(api, values), await connect_call(api, values)


async def assert_refused(api: Api, values: list[str], reason: str, message_key: str | None = None) -> None:
    code = "PERMISSION_DENIED" if reason == "scope" else "UNAUTHENTICATED"
    message = MESSAGES[message_key or reason]
    before = rejections(reason)
    over_grpc, over_connect = await both(api, values)
    assert (over_grpc.code, over_grpc.message) == (code, message)
    assert (over_connect.code, over_connect.message) == (code.lower(), message)
    assert over_connect.status == connect_status(code.lower())
    assert rejections(reason) == before + 2


async def assert_admitted(api: Api, values: list[str]) -> None:
    over_grpc, over_connect = await both(api, values)
    assert (over_grpc.code, over_grpc.message) == ADMITTED
    assert (over_connect.status, over_connect.code, over_connect.message) == (
        400,
        "invalid_argument",
        ADMITTED[1],
    )


# --- the bearer form -----------------------------------------------------------------------------


async def test_a_call_without_a_header_is_missing(api: Api) -> None:
    await assert_refused(api, [], "missing")


@pytest.mark.parametrize(
    "value",
    [
        f"Basic {API_KEY}",
        f"Bearer{API_KEY}",
        "Bearer",
        f"Token {API_KEY}",
        f"Bearer {API_KEY[:8]} {API_KEY[8:]}",
    ],
    ids=["basic", "no-space", "scheme-only", "other-scheme", "space-inside"],
)
async def test_a_header_not_in_the_bearer_form_is_malformed(api: Api, value: str) -> None:
    await assert_refused(api, [value], "malformed", "header")


async def test_two_headers_are_malformed_even_both_good(api: Api) -> None:
    await assert_refused(api, [f"Bearer {API_KEY}", f"Bearer {API_KEY}"], "malformed", "header")


async def test_a_token_over_8192_bytes_is_malformed_before_any_key(api: Api) -> None:
    await assert_refused(api, [f"Bearer {'a' * 8193}"], "malformed")


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
async def test_the_scheme_is_any_letter_case_and_the_token_is_trimmed(api: Api, scheme: str) -> None:
    await assert_admitted(api, [f"{scheme}    {API_KEY}"])


# gRPC clients send no tab or byte outside printable ASCII in metadata: these reach only the HTTP port.
async def test_over_connect_tabs_are_trimmed_and_a_tab_is_not_the_separator(api: Api) -> None:
    assert (await connect_call(api, [f"Bearer \t {API_KEY}"])).code == "invalid_argument"
    answer = await connect_call(api, [f"Bearer\t{API_KEY}"])
    assert (answer.status, answer.message) == (401, MESSAGES["header"])


async def test_over_connect_a_byte_outside_visible_ascii_is_malformed(api: Api) -> None:
    response = await api.http.post(
        "/xmtp.backend.v1.NotificationService/Register",
        content=b"{}",
        headers=[(b"content-type", b"application/json"), (b"authorization", b"Bearer abc\xe9def")],
    )
    assert (response.status_code, response.json()["message"]) == (401, MESSAGES["header"])


# --- API keys ------------------------------------------------------------------------------------


async def test_every_api_key_admits(api: Api) -> None:
    await assert_admitted(api, [f"Bearer {API_KEY}"])
    await assert_admitted(api, [f"Bearer {'o' * 64}"])


async def test_an_api_key_skips_audience_issuer_and_scope(api: Api) -> None:
    # the policy requires all three; the key carries none and is admitted
    await assert_admitted(api, [f"Bearer {API_KEY}"])


async def test_an_api_key_miss_goes_on_to_jwt_verification(api: Api) -> None:
    await assert_refused(api, [f"Bearer {API_KEY[:-1]}x"], "malformed")


# --- JWTs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS, ids=ALGORITHMS)
async def test_each_of_the_six_algorithms_admits_a_good_token(api: Api, key: object) -> None:
    assert hasattr(key, "sign")
    await assert_admitted(api, [f"Bearer {key.sign(good())}"])


@pytest.mark.parametrize("alg", ["none", "HS256", "PS256", "ES512", "ES256K"])
async def test_another_algorithm_is_unsupported(api: Api, alg: str) -> None:
    token = KEYS[0].sign(good(), alg=alg)
    await assert_refused(api, [f"Bearer {token}"], "unsupported_alg")


@pytest.mark.parametrize(
    "token",
    ["a.b", "a.b.c.d", "!!!.e30.c2ln", "e30.W10.c2ln", "W10.e30.c2ln", "eyJhbGciOjF9.e30.c2ln"],
    ids=["two-parts", "four-parts", "not-base64url", "claims-array", "header-array", "alg-number"],
)
async def test_a_token_that_is_not_a_compact_jws_is_malformed(api: Api, token: str) -> None:
    await assert_refused(api, [f"Bearer {token}"], "malformed")


async def test_a_kid_over_256_bytes_is_malformed(api: Api) -> None:
    await assert_refused(api, [f"Bearer {KEYS[3].sign(good(), kid='k' * 257)}"], "malformed")


async def test_a_kid_no_key_has_is_untrusted(api: Api) -> None:
    await assert_refused(api, [f"Bearer {KEYS[3].sign(good(), kid='nobody')}"], "untrusted")


async def test_a_kid_whose_key_is_for_another_alg_is_untrusted(api: Api) -> None:
    # the ES256 key's kid on an RS256 token signed by the RS256 key
    await assert_refused(api, [f"Bearer {KEYS[0].sign(good(), kid=KEYS[3].kid)}"], "untrusted")


async def test_without_a_kid_the_one_key_of_the_alg_is_chosen(api: Api) -> None:
    await assert_admitted(api, [f"Bearer {KEYS[4].sign(good(), kid=None)}"])


async def test_without_a_kid_several_keys_of_the_alg_are_untrusted(api: Api) -> None:
    await assert_refused(api, [f"Bearer {KEYS[0].sign(good(), kid=None)}"], "untrusted")


async def test_a_signature_by_another_key_is_untrusted(api: Api) -> None:
    await assert_refused(api, [f"Bearer {STRANGER.sign(good())}"], "untrusted")


async def test_no_claim_counts_before_the_signature(api: Api) -> None:
    # expired, wrong audience, wrong claim types: still untrusted when the signature is another key's
    token = STRANGER.sign({"exp": "soon", "aud": 5, "iss": ["x"]})
    await assert_refused(api, [f"Bearer {token}"], "untrusted")


@pytest.mark.parametrize(
    "changes",
    [
        {"exp": "9999999999"},
        {"exp": -1},
        {"exp": True},
        {"nbf": "0"},
        {"aud": 5},
        {"aud": ["a", 1]},
        {"iss": ["x"]},
        {"sub": 7},
        {"scope": {"a": 1}},
    ],
    ids=[
        "exp-string",
        "exp-negative",
        "exp-bool",
        "nbf-string",
        "aud-number",
        "aud-mixed",
        "iss-array",
        "sub-number",
        "scope-object",
    ],
)
async def test_a_claim_of_the_wrong_type_is_malformed(api: Api, changes: dict[str, object]) -> None:
    await assert_refused(api, [f"Bearer {KEYS[5].sign(good(**changes))}"], "malformed")


async def test_a_fractional_exp_is_rounded_to_the_second(api: Api) -> None:
    await assert_admitted(api, [f"Bearer {KEYS[5].sign(good(exp=time.time() + 600.4))}"])


async def test_exp_missing_or_past_the_leeway_is_expired(api: Api) -> None:
    now = int(time.time())
    await assert_refused(api, [f"Bearer {KEYS[1].sign(good(exp=now - 40))}"], "expired")
    token = KEYS[1].sign({"aud": AUDIENCE, "iss": ISSUER, "scope": SCOPE})
    await assert_refused(api, [f"Bearer {token}"], "expired")
    await assert_admitted(api, [f"Bearer {KEYS[1].sign(good(exp=now - 20))}"])  # within the 30 s leeway


async def test_nbf_ahead_of_the_leeway_is_not_yet_valid(api: Api) -> None:
    now = int(time.time())
    await assert_refused(api, [f"Bearer {KEYS[2].sign(good(nbf=now + 40))}"], "not_yet_valid")
    await assert_admitted(api, [f"Bearer {KEYS[2].sign(good(nbf=now + 20))}"])


@pytest.mark.parametrize("aud", [None, "other", ["other", "more"]])
async def test_an_audience_not_allowed_is_refused(api: Api, aud: object) -> None:
    token = KEYS[3].sign(good(aud=aud))
    await assert_refused(api, [f"Bearer {token}"], "audience")


async def test_an_audience_array_holding_an_allowed_one_admits(api: Api) -> None:
    await assert_admitted(api, [f"Bearer {KEYS[3].sign(good(aud=['other', AUDIENCE]))}"])


@pytest.mark.parametrize("iss", [None, "https://elsewhere.example"])
async def test_an_issuer_not_allowed_is_refused(api: Api, iss: str | None) -> None:
    token = KEYS[4].sign(good(iss=iss))
    await assert_refused(api, [f"Bearer {token}"], "issuer")


@pytest.mark.parametrize("scope", [None, "read", ["read", "write"], "notifyx"])
async def test_a_missing_scope_is_permission_denied(api: Api, scope: object) -> None:
    token = KEYS[5].sign(good(scope=scope))
    await assert_refused(api, [f"Bearer {token}"], "scope")


async def test_a_scope_array_admits(api: Api) -> None:
    await assert_admitted(api, [f"Bearer {KEYS[5].sign(good(scope=['read', SCOPE]))}"])


async def test_the_claims_are_checked_in_order(api: Api) -> None:
    now = int(time.time())
    everything_wrong = {"exp": now - 100, "nbf": now + 100, "aud": "x", "iss": "x", "scope": "x"}
    await assert_refused(api, [f"Bearer {KEYS[0].sign(everything_wrong, kid=KEYS[0].kid)}"], "expired")
    await assert_refused(
        api, [f"Bearer {KEYS[0].sign({**everything_wrong, 'exp': now + 100})}"], "not_yet_valid"
    )
    fine_times = {**everything_wrong, "exp": now + 100, "nbf": now}
    await assert_refused(api, [f"Bearer {KEYS[0].sign(fine_times)}"], "audience")
    await assert_refused(api, [f"Bearer {KEYS[0].sign({**fine_times, 'aud': AUDIENCE})}"], "issuer")
    await assert_refused(
        api, [f"Bearer {KEYS[0].sign({**fine_times, 'aud': AUDIENCE, 'iss': ISSUER})}"], "scope"
    )
