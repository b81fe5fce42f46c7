"""The JWKS read and fetched within its bounds (docs/callers.md#key-set), against a real HTTP server on
loopback: usable entries kept, others skipped with one WARNING, and every bound a failed fetch."""

from __future__ import annotations

import json
import logging

import pytest

from app.auth.jwks import FetchFailed, fetch_key_set, read_key_set
from tests.support.auth import ALGORITHMS, jwks_server, signing_key

KEYS = [signing_key(alg) for alg in ALGORITHMS]


def document(*entries: dict[str, object]) -> bytes:
    return json.dumps({"keys": list(entries)}).encode()


def test_every_algorithm_s_entry_is_usable() -> None:
    keys = read_key_set(document(*(key.jwk() for key in KEYS)))
    assert [(key.kid, key.alg) for key in keys.keys] == [(key.kid, key.alg) for key in KEYS]


@pytest.mark.parametrize(
    "changes",
    [
        {"alg": "HS256"},
        {"alg": None},
        {"use": "enc"},
        {"kty": "RSA"},
        {"crv": "P-384"},
        {"kid": 5},
        {"kid": "k" * 257},
        {"x": "AAAA"},
    ],
    ids=[
        "alg-other",
        "alg-absent",
        "use-enc",
        "kty-wrong",
        "crv-wrong",
        "kid-number",
        "kid-long",
        "bad-material",
    ],
)
def test_an_unusable_entry_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture, changes: dict[str, object]
) -> None:
    entry = {**KEYS[3].jwk(kid="skipped-" + "x" * 40), **changes}
    entry = {name: value for name, value in entry.items() if value is not None}
    with caplog.at_level(logging.WARNING, "app.auth.jwks"):
        keys = read_key_set(document(entry, KEYS[5].jwk()))
    assert [key.kid for key in keys.keys] == [KEYS[5].kid]
    (line,) = [record.getMessage() for record in caplog.records]
    assert "1 JWKS entries skipped" in line
    assert "x" * 25 not in line  # at most 32 bytes of a kid
    assert KEYS[3].jwk()["x"] not in line


def test_no_usable_entry_fails_the_fetch() -> None:
    with pytest.raises(FetchFailed, match="no usable key"):
        read_key_set(document({**KEYS[0].jwk(), "alg": "none"}))


def test_the_first_64_usable_of_256_examined_are_kept() -> None:
    entries = [{**KEYS[5].jwk(), "kid": f"k{number}"} for number in range(300)]
    assert len(read_key_set(document(*entries))) == 64
    late = [{"kty": "oct", "alg": "HS256"}] * 256 + [KEYS[5].jwk()]
    with pytest.raises(FetchFailed):
        read_key_set(document(*late))


async def test_a_fetch_reads_the_served_keys() -> None:
    with jwks_server(*KEYS) as server:
        assert len(await fetch_key_set(server.url)) == 6
        assert server.requests == 1


@pytest.mark.parametrize("status", [500, 503, 404, 204])
async def test_a_non_2xx_answer_or_no_document_fails(status: int) -> None:
    with jwks_server(*KEYS) as server:
        server.status = status
        with pytest.raises(FetchFailed):
            await fetch_key_set(server.url)


async def test_a_redirect_is_not_followed() -> None:
    with jwks_server(*KEYS) as server, jwks_server(*KEYS) as other:
        server.location = other.url
        with pytest.raises(FetchFailed, match="HTTP 302"):
            await fetch_key_set(server.url)
        assert other.requests == 0


async def test_a_body_over_262144_bytes_fails() -> None:
    with jwks_server() as server:
        padding = [{"kty": "oct", "alg": "HS256", "k": "x" * 1000}] * 262
        server.keys = [KEYS[5].jwk(), *padding]
        assert len(json.dumps({"keys": server.keys})) > 262_144
        with pytest.raises(FetchFailed, match="body over 262144 bytes"):
            await fetch_key_set(server.url)
