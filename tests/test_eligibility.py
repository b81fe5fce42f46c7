"""Who an envelope is pushed to: eligibility, start position, and sender suppression.

Contract: docs/hints.md#envelopes-that-wake-a-device and docs/hints.md#sender-suppression. Keys are derived
exactly as clients do (HKDF-SHA256, implemented here from hmac/hashlib so the test does not share
code with the application).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import replace

import pytest

from app.envelopes.eligibility import (
    HMAC_EPOCH_NS,
    HMAC_KEY_LENGTH,
    Audience,
    audience,
    hmac_epoch,
    is_own_message,
    wants,
)
from app.envelopes.types import Envelope, EnvelopeKind

PERIOD_SECONDS = 2_592_000  # 30 days
SECOND_NS = 1_000_000_000
HKDF_SALT = b"libXMTP HKDF salt!"

ROOT_KEY = bytes(range(32))
GROUP_ID = bytes.fromhex("a1b2c3d4e5f60718293a4b5c6d7e8f90")
TOPIC = b"\x00" + GROUP_ID


# ---- HKDF (RFC 5869), as a client derives its per-epoch HMAC keys ---------------------------------------


def hkdf_sha256(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    counter = 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def test_hkdf_matches_rfc5869_test_case_1() -> None:
    okm = hkdf_sha256(
        salt=bytes.fromhex("000102030405060708090a0b0c"),
        ikm=bytes.fromhex("0b" * 22),
        info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        length=42,
    )
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def epoch_key(epoch: int, root_key: bytes = ROOT_KEY, group_id: bytes = GROUP_ID) -> bytes:
    info = group_id + epoch.to_bytes(8, "little", signed=True)
    return hkdf_sha256(HKDF_SALT, root_key + group_id, info, HMAC_KEY_LENGTH)


def upload_keys(current: int) -> tuple[int, bytes]:
    """What a client uploads: keys for current-1, current, current+1, with base = current-1."""
    return current - 1, b"".join(epoch_key(e) for e in (current - 1, current, current + 1))


def ns_in_epoch(epoch: int, offset_seconds: int = 12_345) -> int:
    return epoch * HMAC_EPOCH_NS + offset_seconds * SECOND_NS


def own_message(epoch: int, data: bytes = b"mls message bytes", key_epoch: int | None = None) -> Envelope:
    """A group message whose sender_hmac was made with the sender's key for `key_epoch` (default: epoch)."""
    key = epoch_key(epoch if key_epoch is None else key_epoch)
    return Envelope(
        topic=TOPIC,
        sequence_id=1,
        server_ns=ns_in_epoch(epoch),
        kind=EnvelopeKind.GROUP_MESSAGE,
        should_push=True,
        sender_hmac=hmac.new(key, data, hashlib.sha256).digest(),
        data=data,
    )


CURRENT = 680  # an epoch in 2025/2026


def test_derived_keys_are_42_bytes_and_differ_per_epoch() -> None:
    keys = {epoch_key(e) for e in range(CURRENT - 1, CURRENT + 2)}
    assert len(keys) == 3
    assert all(len(k) == HMAC_KEY_LENGTH == 42 for k in keys)
    assert epoch_key(CURRENT) != epoch_key(CURRENT, group_id=GROUP_ID[::-1])
    # The epoch is an 8-byte little-endian signed int in the HKDF info.
    assert (-1).to_bytes(8, "little", signed=True) == b"\xff" * 8
    assert epoch_key(-1) != epoch_key(1)


# ---- audience ------------------------------------------------------------------------------------------


def envelope(
    kind: EnvelopeKind, should_push: bool = False, commit: bool = False, received_ns: int = 0
) -> Envelope:
    return Envelope(
        topic=TOPIC,
        sequence_id=7,
        server_ns=ns_in_epoch(CURRENT),
        kind=kind,
        should_push=should_push,
        is_commit_or_proposal=commit,
        received_ns=received_ns,
    )


G, W, OTHER = EnvelopeKind.GROUP_MESSAGE, EnvelopeKind.WELCOME, EnvelopeKind.OTHER


@pytest.mark.parametrize(
    ("kind", "should_push", "commit", "expected"),
    [
        # welcome: always pushed, whatever the flags say
        (W, False, False, Audience.EVERY_SUBSCRIBER),
        (W, True, False, Audience.EVERY_SUBSCRIBER),
        (W, False, True, Audience.EVERY_SUBSCRIBER),
        (W, True, True, Audience.EVERY_SUBSCRIBER),
        # group message, not commit/proposal: should_push decides
        (G, True, False, Audience.EVERY_SUBSCRIBER),
        (G, False, False, Audience.NOBODY),
        # commit or proposal, whatever should_push says: include_commits subscriptions only
        (G, True, True, Audience.COMMIT_SUBSCRIBERS),
        (G, False, True, Audience.COMMIT_SUBSCRIBERS),
        # anything else: never
        (OTHER, False, False, Audience.NOBODY),
        (OTHER, True, False, Audience.NOBODY),
        (OTHER, False, True, Audience.NOBODY),
        (OTHER, True, True, Audience.NOBODY),
    ],
)
def test_audience(kind: EnvelopeKind, should_push: bool, commit: bool, expected: Audience) -> None:
    assert audience(envelope(kind, should_push, commit)) is expected


# ---- wants: audience x include_commits x start position ------------------------------------------------


@pytest.mark.parametrize(
    ("target", "include_commits", "expected"),
    [
        (Audience.EVERY_SUBSCRIBER, False, True),
        (Audience.EVERY_SUBSCRIBER, True, True),
        (Audience.COMMIT_SUBSCRIBERS, False, False),
        (Audience.COMMIT_SUBSCRIBERS, True, True),
        (Audience.NOBODY, False, False),
        (Audience.NOBODY, True, False),
    ],
)
def test_wants_by_audience(target: Audience, include_commits: bool, expected: bool) -> None:
    e = envelope(G, True, received_ns=5_000)
    assert wants(e, target, start_ns=1_000, include_commits=include_commits) is expected


@pytest.mark.parametrize(
    ("received_ns", "start_ns", "expected"),
    [
        (5_000, 4_999, True),
        (5_000, 5_000, True),  # stored at the very moment the envelope arrived: included
        (5_000, 5_001, False),  # stored after the envelope arrived: never receives it
        (5_000, 0, True),
        (0, 1, False),
    ],
)
@pytest.mark.parametrize("target", [Audience.EVERY_SUBSCRIBER, Audience.COMMIT_SUBSCRIBERS])
def test_wants_start_position(received_ns: int, start_ns: int, expected: bool, target: Audience) -> None:
    e = envelope(G, True, received_ns=received_ns)
    assert wants(e, target, start_ns=start_ns, include_commits=True) is expected


def test_start_position_uses_received_time_not_server_time() -> None:
    # A late-arriving old envelope still reaches a subscription stored before it arrived.
    e = envelope(G, True, received_ns=10 * HMAC_EPOCH_NS)
    e = replace(e, server_ns=1)
    assert wants(e, Audience.EVERY_SUBSCRIBER, start_ns=5 * HMAC_EPOCH_NS, include_commits=False)


# ---- hmac_epoch ----------------------------------------------------------------------------------------


def test_hmac_epoch_period_is_30_days() -> None:
    assert HMAC_EPOCH_NS == 30 * 24 * 3600 * SECOND_NS


@pytest.mark.parametrize(
    ("server_ns", "epoch"),
    [
        (0, 0),
        (1, 0),
        (PERIOD_SECONDS * SECOND_NS - 1, 0),
        (PERIOD_SECONDS * SECOND_NS, 1),
        (PERIOD_SECONDS * SECOND_NS + 1, 1),
        (2 * PERIOD_SECONDS * SECOND_NS - 1, 1),
        (2 * PERIOD_SECONDS * SECOND_NS, 2),
        (CURRENT * PERIOD_SECONDS * SECOND_NS - 1, CURRENT - 1),
        (CURRENT * PERIOD_SECONDS * SECOND_NS, CURRENT),
        # 2023-11-14T22:13:20Z = 1_700_000_000 s -> floor(1_700_000_000 / 2_592_000) = 655
        (1_700_000_000 * SECOND_NS, 655),
        (2**64 - 1, (2**64 - 1) // (PERIOD_SECONDS * SECOND_NS)),
    ],
)
def test_hmac_epoch_boundaries(server_ns: int, epoch: int) -> None:
    assert hmac_epoch(server_ns) == epoch


def test_hmac_epoch_is_exact_for_large_timestamps() -> None:
    # Integer arithmetic: a float division would misplace the last nanosecond before a boundary.
    boundary = 9_000 * HMAC_EPOCH_NS
    assert hmac_epoch(boundary - 1) == 8_999
    assert hmac_epoch(boundary) == 9_000


# ---- is_own_message ------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 1, 2])
def test_own_message_in_window_is_suppressed(index: int) -> None:
    base, keys = upload_keys(CURRENT)
    assert is_own_message(own_message(base + index), base, keys) is True


@pytest.mark.parametrize("index", [-1, 3, 4, -100])
def test_epoch_outside_window_sends(index: int) -> None:
    base, keys = upload_keys(CURRENT)
    # The sender really used its key for that epoch; we just do not hold it.
    assert is_own_message(own_message(base + index), base, keys) is False


def test_suppression_uses_the_server_timestamp_epoch() -> None:
    base, keys = upload_keys(CURRENT)
    message = own_message(CURRENT, key_epoch=CURRENT)
    assert is_own_message(message, base, keys)
    # Same hmac, but the server stamped it one epoch later: the key at that index differs, so it sends.
    later = replace(message, server_ns=ns_in_epoch(CURRENT + 1))
    assert is_own_message(later, base, keys) is False
    # The last nanosecond of the previous epoch selects index 0 (base), not the current key.
    edge = replace(message, server_ns=CURRENT * HMAC_EPOCH_NS - 1)
    assert is_own_message(edge, base, keys) is False
    assert is_own_message(replace(edge, server_ns=CURRENT * HMAC_EPOCH_NS), base, keys) is True


def test_other_members_message_sends() -> None:
    base, keys = upload_keys(CURRENT)
    other_member = hkdf_sha256(
        HKDF_SALT, b"\x99" * 32 + GROUP_ID, GROUP_ID + CURRENT.to_bytes(8, "little"), 42
    )
    data = b"someone else"
    message = replace(
        own_message(CURRENT), data=data, sender_hmac=hmac.new(other_member, data, hashlib.sha256).digest()
    )
    assert is_own_message(message, base, keys) is False


@pytest.mark.parametrize("length", [0, 1, 31, 33, 64])
def test_sender_hmac_of_wrong_length_sends(length: int) -> None:
    base, keys = upload_keys(CURRENT)
    good = own_message(CURRENT)
    mangled = (good.sender_hmac * 2)[:length]
    assert is_own_message(replace(good, sender_hmac=mangled), base, keys) is False


def test_sender_hmac_truncated_prefix_of_a_longer_value_sends() -> None:
    base, keys = upload_keys(CURRENT)
    good = own_message(CURRENT)
    assert is_own_message(replace(good, sender_hmac=good.sender_hmac + b"\x00"), base, keys) is False


@pytest.mark.parametrize(
    ("has_base", "keys"), [(False, None), (True, None), (True, b""), (False, "uploaded")]
)
def test_missing_keys_send(has_base: bool, keys: bytes | str | None) -> None:
    base, uploaded = upload_keys(CURRENT)
    key_bytes = uploaded if keys == "uploaded" else keys
    assert isinstance(key_bytes, bytes | None)
    assert is_own_message(own_message(CURRENT), base if has_base else None, key_bytes) is False


def test_fewer_keys_than_the_window_only_cover_their_epochs() -> None:
    base = CURRENT - 1
    keys = epoch_key(base) + epoch_key(base + 1)  # only two keys uploaded
    assert is_own_message(own_message(base), base, keys) is True
    assert is_own_message(own_message(base + 1), base, keys) is True
    assert is_own_message(own_message(base + 2), base, keys) is False


def test_keys_beyond_the_window_are_ignored() -> None:
    base = CURRENT - 1
    keys = b"".join(epoch_key(e) for e in range(base, base + 4))
    assert is_own_message(own_message(base + 2), base, keys) is True
    assert is_own_message(own_message(base + 3), base, keys) is False


def test_wrong_data_sends() -> None:
    base, keys = upload_keys(CURRENT)
    message = own_message(CURRENT)
    assert is_own_message(replace(message, data=message.data + b"!"), base, keys) is False
    assert is_own_message(replace(message, data=b""), base, keys) is False


def test_flipped_hmac_bit_sends() -> None:
    base, keys = upload_keys(CURRENT)
    message = own_message(CURRENT)
    flipped = bytes([message.sender_hmac[0] ^ 1]) + message.sender_hmac[1:]
    assert is_own_message(replace(message, sender_hmac=flipped), base, keys) is False


def test_key_of_another_epoch_sends() -> None:
    base, keys = upload_keys(CURRENT)
    # Stamped in CURRENT, but the hmac was made with the key for CURRENT+1.
    assert is_own_message(own_message(CURRENT, key_epoch=CURRENT + 1), base, keys) is False


@pytest.mark.parametrize("kind", [EnvelopeKind.WELCOME, EnvelopeKind.OTHER])
def test_non_group_kinds_are_never_suppressed(kind: EnvelopeKind) -> None:
    base, keys = upload_keys(CURRENT)
    message = replace(own_message(CURRENT), kind=kind)
    assert is_own_message(message, base, keys) is False


def test_commits_are_suppressed_like_other_group_messages() -> None:
    base, keys = upload_keys(CURRENT)
    message = replace(own_message(CURRENT), is_commit_or_proposal=True, should_push=False)
    assert is_own_message(message, base, keys) is True
