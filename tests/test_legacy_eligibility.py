"""Which legacy subscriptions are pushed a message: sender suppression per thirty-day period, then
`should_push`; welcomes and unparsable messages always.

Contract: docs/legacy.md#eligibility, with its test vector (docs/legacy.md#test-vector): the keys are
derived here with HKDF as a client derives them, the message is the vector's 93 bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from app.legacy.eligibility import Verdict, period, verdict
from app.legacy.messages import MessageKind, ParsedMessage, idempotency_key, parse
from tests.support.legacy_vector import DATA, MESSAGE_B64, TIMESTAMP_NS, TOPIC, key

# --------------------------------------------------------------------------- the vector


def test_the_vectors_keys() -> None:
    assert key(671).hex() == (
        "459d0b12a3661ddc48ee86590ed9d038bd935defb1eaa203c7a7da3e230d0543840a74b76d31d32622d6"
    )
    assert key(670).hex().startswith("89d9089d") and key(670).hex().endswith("2b6ffc8cb5b26b25f945")


def test_the_vectors_message_and_idempotency_key() -> None:
    message = base64.b64decode(MESSAGE_B64)
    assert len(message) == 93
    assert period(TIMESTAMP_NS) == 671
    parsed = parse(TOPIC, message)
    assert parsed.data == DATA and parsed.should_push is True
    assert parsed.sender_hmac == hmac.digest(key(671), DATA, hashlib.sha256)
    assert parsed.sender_hmac.hex() == "d3cda07b33eba0f1026025d08119354be0e7e35208a0505cbd8f9a78ff5f75b6"
    assert idempotency_key(TOPIC, message) == "f674ca6c319e2677c05509d0a63336fcbfdb187f"


def test_the_vector_is_suppressed_with_the_key_of_its_period() -> None:
    parsed = parse(TOPIC, base64.b64decode(MESSAGE_B64))
    assert verdict(parsed, {671: key(671)}, TIMESTAMP_NS) is Verdict.SUPPRESSED
    assert verdict(parsed, {670: key(670), 671: key(671), 672: key(672)}, TIMESTAMP_NS) is Verdict.SUPPRESSED


@pytest.mark.parametrize(
    "keys",
    [{670: key(670)}, {}, {672: key(671)}, {671: b""}, {671: key(670)}],
    ids=["only key(670)", "none", "key(671) stored for another period", "an empty key", "another key"],
)
def test_the_vector_is_pushed_without_the_key_of_its_period(keys: dict[int, bytes]) -> None:
    parsed = parse(TOPIC, base64.b64decode(MESSAGE_B64))
    assert verdict(parsed, keys, TIMESTAMP_NS) is Verdict.PUSH


# --------------------------------------------------------------------------- the rules


def test_periods_are_thirty_days_of_the_networks_time() -> None:
    assert period(0) == 0
    assert period(2_592_000 * 10**9 - 1) == 0
    assert period(2_592_000 * 10**9) == 1
    assert period(2**64 - 1) == (2**64 - 1) // (2_592_000 * 10**9)


def test_a_message_without_should_push_is_ineligible_unless_suppressed() -> None:
    own = ParsedMessage(MessageKind.GROUP, DATA, hmac.digest(key(671), DATA, hashlib.sha256), False)
    assert verdict(own, {}, TIMESTAMP_NS) is Verdict.INELIGIBLE
    assert verdict(own, {671: key(671)}, TIMESTAMP_NS) is Verdict.SUPPRESSED


def test_no_sender_hmac_suppresses_nothing() -> None:
    message = ParsedMessage(MessageKind.GROUP, DATA, b"", True)
    assert verdict(message, {671: key(671)}, TIMESTAMP_NS) is Verdict.PUSH


def test_a_sender_hmac_of_another_length_suppresses_nothing() -> None:
    mac = hmac.digest(key(671), DATA, hashlib.sha256)
    message = ParsedMessage(MessageKind.GROUP, DATA, mac[:31], True)
    assert verdict(message, {671: key(671)}, TIMESTAMP_NS) is Verdict.PUSH


@pytest.mark.parametrize("kind", [MessageKind.WELCOME, MessageKind.UNPARSABLE])
def test_welcomes_and_unparsable_messages_are_always_pushed(kind: MessageKind) -> None:
    # Even with data and an HMAC that the key would match: neither is read.
    message = ParsedMessage(kind, DATA, hmac.digest(key(671), DATA, hashlib.sha256), False)
    assert verdict(message, {671: key(671)}, TIMESTAMP_NS) is Verdict.PUSH
