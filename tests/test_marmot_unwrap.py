"""Unwrapping Marmot triggers: a valid gift wrap gives its chunks; each refused form is refused with
its fixed reason, before any chunk is decrypted. Wraps are built layer by layer (app/marmot/giftwrap.py)
so each test spoils exactly one thing.

Contract: docs/marmot.md#the-trigger.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from app.marmot import nip44, secp
from app.marmot.events import sign_event, verify_event
from app.marmot.giftwrap import gift_wrap, seal, trigger_rumor, wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.tokens import ENCRYPTED_TOKEN_SIZE, DeviceToken, Platform, decrypt_token, encrypt_token
from app.marmot.unwrap import (
    MAX_CONTENT_CHARS,
    MAX_WRAP_CONTENT_CHARS,
    Refused,
    decode_content,
    split_chunks,
    unwrap_trigger,
)

SERVER = ServerKey(bytes(31) + b"\x2a")
SENDER = bytes(31) + b"\x11"
OTHER = bytes(31) + b"\x22"
APNS = "a1" * 32
FCM = "fcm-registration-token:APA91b" + "z" * 100


def _chunks() -> bytes:
    return encrypt_token(SERVER.public_x, Platform.APNS, APNS) + encrypt_token(
        SERVER.public_x, Platform.FCM, FCM
    )


def _wrap(
    content: bytes | None = None,
    *,
    rumor: dict[str, Any] | None = None,
    seal_secret: bytes = SENDER,
    seal_tags: list[list[str]] | None = None,
    spoil_seal: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rumor = trigger_rumor(SENDER, _chunks() if content is None else content) if rumor is None else rumor
    sealed = seal(rumor, seal_secret, SERVER.public_x, tags=seal_tags or [])
    return gift_wrap({**sealed, **(spoil_seal or {})}, SERVER.public_x)


def _refused(event: dict[str, Any]) -> str:
    with pytest.raises(Refused) as refused:
        unwrap_trigger(event, SERVER)
    assert str(refused.value) == refused.value.reason
    return refused.value.reason


def test_a_valid_trigger_unwraps_to_its_chunks() -> None:
    content = _chunks()
    wrap = _wrap(content)
    assert wrap["kind"] == 1059 and wrap["tags"] == [["p", SERVER.public_hex]]
    assert unwrap_trigger(wrap, SERVER) == content
    chunks = split_chunks(content)
    assert [decrypt_token(SERVER.secret, c) for c in chunks] == [
        DeviceToken(Platform.APNS, APNS),
        DeviceToken(Platform.FCM, FCM),
    ]


def test_a_wrap_that_went_through_json_unwraps() -> None:
    wrap = json.loads(json.dumps(wrap_trigger(_chunks(), SERVER.public_x)))
    assert len(split_chunks(unwrap_trigger(wrap, SERVER))) == 2


def test_chunks_are_not_decrypted_while_unwrapping() -> None:
    """Random padding passes the unwrap: the chunks are left to the per-chunk path."""
    padding = os.urandom(3 * ENCRYPTED_TOKEN_SIZE)
    assert unwrap_trigger(_wrap(padding), SERVER) == padding


def test_thirty_two_chunks_are_accepted_with_the_extended_nip44_prefix() -> None:
    content = os.urandom(32 * ENCRYPTED_TOKEN_SIZE)
    wrap = _wrap(content)
    assert len(base64.b64encode(content)) == MAX_CONTENT_CHARS
    assert len(base64.b64decode(wrap["content"])) > 65_535 + 99  # the seal needed the u32 length
    assert unwrap_trigger(wrap, SERVER) == content


def test_a_wrong_wrap_kind_is_refused() -> None:
    good = _wrap()
    event = sign_event(secp.fresh_secret(), 1058, good["tags"], good["content"], good["created_at"])
    assert _refused(event) == "wrap_kind"
    assert _refused({**good, "kind": "1059"}) == "wrap_kind"


def test_a_bad_wrap_signature_or_id_is_refused() -> None:
    good = _wrap()
    flipped = "1" if good["sig"][-1] == "0" else "0"
    assert _refused({**good, "sig": good["sig"][:-1] + flipped}) == "wrap_signature"
    assert _refused({**good, "created_at": good["created_at"] + 1}) == "wrap_signature"
    assert _refused({**good, "tags": []}) == "wrap_signature"
    assert _refused({k: v for k, v in good.items() if k != "sig"}) == "wrap_signature"


def test_a_wrap_too_large_is_refused_before_its_signature_is_checked() -> None:
    good = _wrap()
    huge = {**good, "content": "A" * (MAX_WRAP_CONTENT_CHARS + 1)}
    assert _refused(huge) == "wrap_size"
    assert _refused({**good, "content": None}) == "wrap_size"


def test_a_wrap_for_another_server_is_refused() -> None:
    other = ServerKey(OTHER)
    wrap = gift_wrap(seal(trigger_rumor(SENDER, _chunks()), SENDER, other.public_x), other.public_x)
    assert unwrap_trigger(wrap, other)
    assert _refused(wrap) == "wrap_decrypt"


def _wrap_plaintext(plaintext: bytes) -> dict[str, Any]:
    """A valid wrap around any seal plaintext."""
    wrapper = secp.fresh_secret()
    content = nip44.encrypt(plaintext, nip44.conversation_key(wrapper, SERVER.public_x))
    return sign_event(wrapper, 1059, [["p", SERVER.public_hex]], content, 1700000000)


@pytest.mark.parametrize(
    "plaintext",
    [b"not json", b"[1,2]", b'"a string"', b"\xff\xfe{}", b"[" * 40_000 + b"]" * 40_000, b"1" + b"0" * 5000],
    ids=["not json", "a list", "a string", "not utf-8", "nested deep", "a huge number"],
)
def test_a_seal_that_is_not_a_json_object_is_refused(plaintext: bytes) -> None:
    assert _refused(_wrap_plaintext(plaintext)) == "seal_json"


def test_a_seal_over_its_size_bound_is_refused_before_parsing() -> None:
    assert _refused(_wrap_plaintext(b" " * 95_000)) == "seal_size"


def test_a_wrong_seal_kind_is_refused() -> None:
    rumor = trigger_rumor(SENDER, _chunks())
    content = nip44.encrypt(json.dumps(rumor).encode(), nip44.conversation_key(SENDER, SERVER.public_x))
    sealed = sign_event(SENDER, 14, [], content, 1700000000)
    assert _refused(gift_wrap(sealed, SERVER.public_x)) == "seal_kind"


def test_a_bad_seal_signature_is_refused() -> None:
    sealed = seal(trigger_rumor(SENDER, _chunks()), SENDER, SERVER.public_x)
    other = sign_event(OTHER, 13, [], sealed["content"], sealed["created_at"])
    assert _refused(gift_wrap({**sealed, "sig": other["sig"]}, SERVER.public_x)) == "seal_signature"
    assert _refused(gift_wrap({**sealed, "created_at": 5}, SERVER.public_x)) == "seal_signature"
    assert _refused(_wrap(spoil_seal={"pubkey": other["pubkey"]})) == "seal_signature"


def test_a_seal_with_tags_is_refused() -> None:
    assert _refused(_wrap(seal_tags=[["p", SERVER.public_hex]])) == "seal_tags"
    assert _refused(_wrap(seal_tags=[[]])) == "seal_tags"


def test_a_seal_whose_content_is_not_for_this_server_is_refused() -> None:
    other = ServerKey(OTHER)
    sealed = seal(trigger_rumor(SENDER, _chunks()), SENDER, other.public_x)
    assert _refused(gift_wrap(sealed, SERVER.public_x)) == "seal_decrypt"


def test_rumor_and_seal_pubkeys_differing_is_refused() -> None:
    rumor = trigger_rumor(OTHER, _chunks())
    assert _refused(_wrap(rumor=rumor)) == "rumor_pubkey"
    assert _refused(
        _wrap(rumor={k: v for k, v in trigger_rumor(SENDER, _chunks()).items() if k != "pubkey"})
    ) == ("rumor_pubkey")


@pytest.mark.parametrize("kind", [445, 447, 1059, 13, 0])
def test_a_wrong_rumor_kind_is_refused(kind: int) -> None:
    assert _refused(_wrap(rumor=trigger_rumor(SENDER, _chunks(), kind=kind))) == "rumor_kind"


def test_a_rumor_kind_that_is_not_an_integer_is_refused() -> None:
    rumor = trigger_rumor(SENDER, _chunks())
    assert _refused(_wrap(rumor={**rumor, "kind": 446.0})) == "rumor_kind"
    assert _refused(_wrap(rumor={**rumor, "kind": "446"})) == "rumor_kind"


@pytest.mark.parametrize(
    "tags",
    [
        [],
        [["v", "marmot-push-v2"]],
        [["v", "marmot-push-v1"], ["p", "00" * 32]],
        [["p", "00" * 32], ["v", "marmot-push-v1"]],
        [["v", "marmot-push-v1"], ["v", "marmot-push-v1"]],
        [["v", "marmot-push-v1", "extra"]],
        [["v"]],
        [["V", "marmot-push-v1"]],
        [["encoding", "base64"], ["v", "marmot-push-v1"]],
    ],
)
def test_wrong_or_extra_rumor_tags_are_refused(tags: list[list[str]]) -> None:
    assert _refused(_wrap(rumor=trigger_rumor(SENDER, _chunks(), tags=tags))) == "rumor_tags"


def _encoded(text: object) -> dict[str, Any]:
    return _wrap(rumor={**trigger_rumor(SENDER, b""), "content": text})


def test_content_too_long_is_refused_before_decoding() -> None:
    assert _refused(_encoded("A" * (MAX_CONTENT_CHARS + 4))) == "content_too_long"
    assert _refused(_encoded("!" * (MAX_CONTENT_CHARS + 1))) == "content_too_long"


def test_more_than_32_chunks_are_refused() -> None:
    # 33 chunks encode to 47,696 characters: the length bound (46,252) is the check that catches them.
    content = os.urandom(33 * ENCRYPTED_TOKEN_SIZE)
    assert _refused(_wrap(content)) == "content_too_long"


def test_a_content_length_not_a_multiple_of_1084_is_refused() -> None:
    for size in (1, 1083, 1085, 2 * ENCRYPTED_TOKEN_SIZE - 1):
        assert _refused(_wrap(os.urandom(size))) == "content_length"


def test_empty_content_is_refused() -> None:
    assert _refused(_wrap(b"")) == "content_empty"


def _non_canonical_forms(content: bytes) -> list[str]:
    text = base64.b64encode(content).decode()
    assert text.endswith("==")  # 1084 bytes leave one byte over: 4 spare bits in the last symbol
    last = text[-3]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    spare_bits_set = text[:-3] + alphabet[alphabet.index(last) | 1] + "=="
    assert base64.b64decode(spare_bits_set) == content
    return [
        spare_bits_set,
        text[:-2],  # padding left out
        text[:100] + "\n" + text[100:],
        text + " ",
        text.replace("+", "-").replace("/", "_") if ("+" in text or "/" in text) else text[:-4] + "-_==",
        "=" + text,
        text[:-2] + "=\u0430",
    ]


def test_non_canonical_base64_is_refused() -> None:
    content = os.urandom(ENCRYPTED_TOKEN_SIZE)
    for form in _non_canonical_forms(content):
        assert _refused(_encoded(form)) == "content_base64"
    assert _refused(_encoded(5)) == "content_base64"
    assert unwrap_trigger(_encoded(base64.b64encode(content).decode()), SERVER) == content


def test_every_reason_is_a_fixed_code() -> None:
    reasons = {
        _refused(_wrap(b"")),
        _refused(_wrap(seal_tags=[["x"]])),
        _refused(_wrap(rumor=trigger_rumor(OTHER, b"x"))),
    }
    assert reasons == {"content_empty", "seal_tags", "rumor_pubkey"}


def test_decode_content_and_split_chunks() -> None:
    content = bytes(range(256)) * 17
    content = content[: 4 * ENCRYPTED_TOKEN_SIZE]
    chunks = split_chunks(decode_content(base64.b64encode(content).decode()))
    assert len(chunks) == 4 and b"".join(chunks) == content
    assert all(len(chunk) == ENCRYPTED_TOKEN_SIZE for chunk in chunks)
    with pytest.raises(ValueError, match="1084"):
        split_chunks(content[:-1])


def test_built_layers_are_valid_events() -> None:
    sealed = seal(trigger_rumor(SENDER, _chunks()), SENDER, SERVER.public_x)
    assert verify_event(sealed) and sealed["kind"] == 13 and sealed["tags"] == []
    assert verify_event(gift_wrap(sealed, SERVER.public_x))
    assert (
        decrypt_token(SERVER.secret, split_chunks(unwrap_trigger(_wrap(), SERVER))[0]).platform
        is Platform.APNS
    )
