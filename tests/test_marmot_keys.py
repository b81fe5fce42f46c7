"""The Marmot server key (hex, nsec1, a file) and Nostr events (NIP-01 ids, BIP-340 signatures).

Contract: docs/marmot.md#the-trigger; the key pair below is NIP-19's published example.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.marmot import secp
from app.marmot.events import event_id, serialize, sign_event, verify_event
from app.marmot.keys import InvalidServerKey, ServerKey, bech32_decode, bech32_encode

SECRET_HEX = "67dea2ed018072d675f5415ecfaed7d2597555e202d85b3d65ea4e58d2d92ffa"
NSEC = "nsec1vl029mgpspedva04g90vltkh6fvh240zqtv9k0t9af8935ke9laqsnlfe5"
PUBLIC_HEX = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"
NPUB = "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"
ORDER_HEX = "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141"


@pytest.mark.parametrize("text", [SECRET_HEX, SECRET_HEX.upper(), NSEC, f"  {NSEC}\n", f"\t{SECRET_HEX}\n"])
def test_a_key_parses_from_hex_or_nsec(text: str) -> None:
    key = ServerKey.parse(text)
    assert key.secret == bytes.fromhex(SECRET_HEX)
    assert key.public_hex == PUBLIC_HEX
    assert key.public_x == bytes.fromhex(PUBLIC_HEX)
    assert key.npub == NPUB


@pytest.mark.parametrize("content", [SECRET_HEX, f"{NSEC}\n", f"\n  {SECRET_HEX}  \r\n"])
def test_a_key_parses_from_a_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "marmot.key"
    path.write_text(content)
    assert ServerKey.parse(str(path)).public_hex == PUBLIC_HEX
    assert ServerKey.parse(f" {path} ").npub == NPUB


def test_the_repr_shows_the_public_key_and_hides_the_secret() -> None:
    key = ServerKey.parse(SECRET_HEX)
    for shown in (repr(key), str(key), f"{key}", repr([key])):
        assert PUBLIC_HEX in shown
        assert SECRET_HEX not in shown.lower()


BAD_VALUES = {
    "empty": "   ",
    "63 hex": SECRET_HEX[:-1],
    "65 hex": SECRET_HEX + "a",
    "not hex": "g" * 64,
    "zero": "00" * 32,
    "the group order": ORDER_HEX,
    "above the order": "ff" * 32,
    "nsec checksum": NSEC[:-1] + ("q" if NSEC[-1] != "q" else "p"),
    "npub instead of nsec": NPUB,
    "nsec of 31 bytes": bech32_encode("nsec", bytes.fromhex(SECRET_HEX)[:31]),
    "nsec of zero": bech32_encode("nsec", bytes(32)),
    "no such file": "/nonexistent/marmot.key",
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_key_is_refused_with_an_error_that_does_not_carry_it(name: str) -> None:
    value = BAD_VALUES[name]
    with pytest.raises(InvalidServerKey) as refused:
        ServerKey.parse(value)
    message = str(refused.value)
    assert message.startswith("the Marmot secret key")
    assert value.strip() == "" or value.strip().lower() not in message.lower()
    # No chained exception carries the value into a traceback either.
    assert refused.value.__cause__ is None
    assert refused.value.__context__ is None or refused.value.__suppress_context__


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not a key\n", "does not hold"),
        ("0" * 64, "not a valid secp256k1 secret"),
        ("x" * 2000, "over 1024 bytes"),
        (b"\xff\xfe" + b"a" * 62, "not ASCII"),
    ],
)
def test_a_bad_key_file_is_refused_without_its_content(
    tmp_path: Path, content: str | bytes, words: str
) -> None:
    path = tmp_path / "marmot.key"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(InvalidServerKey, match=words) as refused:
        ServerKey.parse(str(path))
    assert str(path) not in str(refused.value)


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidServerKey, match="IsADirectoryError"):
        ServerKey.parse(str(tmp_path))


def test_bech32_round_trips_and_refuses_another_prefix() -> None:
    data = bytes(range(32))
    assert bech32_decode("npub", bech32_encode("npub", data)) == data
    assert bech32_decode("nsec", bech32_encode("npub", data)) is None
    assert bech32_decode("npub", NPUB.upper()) == bytes.fromhex(PUBLIC_HEX)
    assert bech32_decode("npub", "npub1" + NPUB[5:].upper()) is None  # mixed case


def test_a_key_from_bytes_needs_a_valid_scalar() -> None:
    assert ServerKey(bytes.fromhex(SECRET_HEX)) == ServerKey.parse(NSEC)
    with pytest.raises(InvalidServerKey):
        ServerKey(bytes(32))
    with pytest.raises(InvalidServerKey):
        ServerKey(bytes.fromhex(SECRET_HEX)[:31])


# Events.

SECRET = bytes.fromhex(SECRET_HEX)


def test_the_serialization_is_nip01_exactly() -> None:
    content = 'line\nquote" back\\ tab\t cr\r bs\b ff\f ctl\x01 del\x7f é 🦄'
    event = {
        "pubkey": PUBLIC_HEX,
        "created_at": 1700000000,
        "kind": 1,
        "tags": [["p", "x"]],
        "content": content,
    }
    expected = (
        f'[0,"{PUBLIC_HEX}",1700000000,1,[["p","x"]],'
        '"line\\nquote\\" back\\\\ tab\\t cr\\r bs\\b ff\\f ctl\\u0001 del\x7f é 🦄"]'
    ).encode()
    assert serialize(event) == expected
    assert event_id(event) == hashlib.sha256(expected).hexdigest()


def test_a_signed_event_verifies_and_carries_its_fields() -> None:
    event = sign_event(SECRET, 1059, [["p", PUBLIC_HEX]], "hello", 1700000000)
    assert event["pubkey"] == PUBLIC_HEX
    assert event["id"] == event_id(event)
    assert (event["kind"], event["tags"], event["content"], event["created_at"]) == (
        1059,
        [["p", PUBLIC_HEX]],
        "hello",
        1700000000,
    )
    assert verify_event(event)
    assert verify_event(json.loads(json.dumps(event)))


def test_fixed_aux_randomness_signs_reproducibly() -> None:
    first = sign_event(SECRET, 1, [], "x", 1, aux_random=bytes(32))
    assert first == sign_event(SECRET, 1, [], "x", 1, aux_random=bytes(32))
    assert first["sig"] != sign_event(SECRET, 1, [], "x", 1, aux_random=b"\x01" * 32)["sig"]


def _tampered(event: dict[str, object], **changes: object) -> dict[str, object]:
    return {**event, **changes}


def test_a_changed_field_or_signature_fails_verification() -> None:
    event = sign_event(SECRET, 1, [["v", "1"]], "hello", 1700000000)
    other = sign_event(bytes(31) + b"\x02", 1, [["v", "1"]], "hello", 1700000000)
    flipped_sig = ("0" if event["sig"][0] != "0" else "1") + event["sig"][1:]
    for bad in (
        _tampered(event, content="hellp"),
        _tampered(event, kind=2),
        _tampered(event, created_at=1700000001),
        _tampered(event, tags=[["v", "2"]]),
        _tampered(event, sig=flipped_sig),
        _tampered(event, sig=other["sig"]),
        _tampered(event, pubkey=other["pubkey"]),
        _tampered(event, pubkey=other["pubkey"], id=other["id"]),
        _tampered(event, id=other["id"]),
    ):
        assert not verify_event(bad)


@pytest.mark.parametrize(
    "changes",
    [
        {"id": "A" * 64},
        {"id": None},
        {"pubkey": "ff" * 32},  # no point has this X
        {"sig": "00" * 63},
        {"sig": 5},
        {"kind": "1"},
        {"kind": True},
        {"kind": 65536},
        {"kind": -1},
        {"created_at": 1.5},
        {"created_at": 2**53},
        {"tags": [["v", 1]]},
        {"tags": ["v"]},
        {"tags": None},
        {"content": None},
        {"content": "\ud800"},
    ],
)
def test_a_malformed_event_is_refused_without_raising(changes: dict[str, object]) -> None:
    event = sign_event(SECRET, 1, [], "x", 1)
    assert not verify_event({**event, **changes})


def test_a_missing_field_is_refused() -> None:
    event = sign_event(SECRET, 1, [], "x", 1)
    for field in event:
        assert not verify_event({k: v for k, v in event.items() if k != field})


def test_schnorr_helpers_refuse_bad_keys() -> None:
    assert not secp.schnorr_verify(bytes(32), bytes(32), bytes(64))
    assert not secp.schnorr_verify(bytes(31), bytes(32), bytes(64))
    with pytest.raises(secp.CurveError):
        secp.schnorr_sign(bytes(32), bytes(32))
    with pytest.raises(secp.CurveError):
        secp.xonly_public_key(bytes.fromhex(ORDER_HEX))
