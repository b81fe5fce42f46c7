"""Telling commits and proposals from application messages by the MLS framing alone.

Contract: docs/xmtp-network.md#what-the-listener-reads (commits and proposals). Every input here is built
by hand, byte by byte, from the RFC 9420 wire layout as that page states it; nothing comes from app/.
"""

from __future__ import annotations

import pytest

from app.network.mls import is_commit_or_proposal

GROUP_ID = bytes(range(16))
EPOCH = (0x0102030405060708).to_bytes(8, "big")


def u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def vector(data: bytes, size: int) -> bytes:
    """MLS <V>: top two bits of the first byte give the length of the length (00 = 1, 01 = 2, 10 = 4)."""
    if size == 1:
        return bytes([len(data)]) + data
    if size == 2:
        return bytes([0x40 | (len(data) >> 8), len(data) & 0xFF]) + data
    if size == 4:
        n = len(data)
        return bytes([0x80 | (n >> 24), (n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF]) + data
    raise AssertionError(size)


def private(content_type: int, group_id: bytes = GROUP_ID, size: int = 1, version: int = 1) -> bytes:
    # version, wire_format 2, group_id<V>, epoch, content_type, then aad<V>, sender data<V>, ciphertext<V>
    return (
        u16(version)
        + u16(2)
        + vector(group_id, size)
        + EPOCH
        + bytes([content_type])
        + b"\x00"
        + vector(b"s" * 20, 1)
        + vector(b"c" * 150, 2)
    )


def public(
    content_type: int,
    sender_type: int,
    group_id: bytes = GROUP_ID,
    size: int = 1,
    aad: bytes = b"",
    aad_size: int = 1,
) -> bytes:
    sender = bytes([sender_type]) + (b"\x00\x00\x00\x05" if sender_type in (1, 2) else b"")
    return (
        u16(1)
        + u16(1)
        + vector(group_id, size)
        + EPOCH
        + sender
        + vector(aad, aad_size)
        + bytes([content_type])
        + b"body" * 10
    )


# --- PrivateMessage ---------------------------------------------------------------------------


@pytest.mark.parametrize(("content_type", "expected"), [(1, False), (2, True), (3, True)])
def test_private_message_content_types(content_type: int, expected: bool) -> None:
    assert is_commit_or_proposal(private(content_type)) is expected


@pytest.mark.parametrize("content_type", [0, 4, 255])
def test_private_message_unknown_content_types_are_not_commits(content_type: int) -> None:
    assert is_commit_or_proposal(private(content_type)) is False


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize(("content_type", "expected"), [(1, False), (2, True), (3, True)])
def test_private_message_group_id_prefix_lengths(size: int, content_type: int, expected: bool) -> None:
    assert is_commit_or_proposal(private(content_type, size=size)) is expected


def test_two_byte_prefix_with_a_long_group_id() -> None:
    # 300 bytes need the 2-byte form; the value starts in the first byte's low 6 bits.
    long_id = bytes(300)
    framed = private(3, group_id=long_id, size=2)
    assert framed[4:6] == bytes([0x41, 0x2C])
    assert is_commit_or_proposal(framed) is True
    assert is_commit_or_proposal(private(1, group_id=long_id, size=2)) is False


def test_four_byte_prefix_with_a_long_group_id() -> None:
    long_id = bytes(70_000)
    framed = private(2, group_id=long_id, size=4)
    assert framed[4:8] == bytes([0x80, 0x01, 0x11, 0x70])
    assert is_commit_or_proposal(framed) is True


def test_empty_group_id() -> None:
    assert is_commit_or_proposal(private(3, group_id=b"")) is True


# --- PublicMessage -------------------------------------------------------------------------------


@pytest.mark.parametrize("sender_type", [1, 2, 3, 4])
@pytest.mark.parametrize(("content_type", "expected"), [(1, False), (2, True), (3, True)])
def test_public_message_every_sender_type(sender_type: int, content_type: int, expected: bool) -> None:
    assert is_commit_or_proposal(public(content_type, sender_type)) is expected


def test_sender_index_is_skipped_only_for_member_and_external() -> None:
    # With sender type 3 there is no index: the next byte is the aad length (0), then content type 3.
    framed = u16(1) + u16(1) + vector(GROUP_ID, 1) + EPOCH + b"\x03" + b"\x00" + b"\x03"
    assert is_commit_or_proposal(framed) is True
    # The same bytes read as a member sender would need 4 more bytes before the aad: truncated.
    as_member = u16(1) + u16(1) + vector(GROUP_ID, 1) + EPOCH + b"\x01" + b"\x00" + b"\x03"
    assert is_commit_or_proposal(as_member) is False
    # A member's index whose bytes look like a commit are skipped, not read as the content type.
    tricky = u16(1) + u16(1) + vector(GROUP_ID, 1) + EPOCH + b"\x01" + b"\x03\x03\x03\x03" + b"\x00" + b"\x01"
    assert is_commit_or_proposal(tricky) is False


@pytest.mark.parametrize("sender_type", [0, 5, 255])
def test_public_message_unknown_sender_type_is_not_a_commit(sender_type: int) -> None:
    assert is_commit_or_proposal(public(3, sender_type)) is False


@pytest.mark.parametrize("size", [1, 2, 4])
def test_public_message_group_id_prefix_lengths(size: int) -> None:
    assert is_commit_or_proposal(public(3, 1, size=size)) is True
    assert is_commit_or_proposal(public(1, 1, size=size)) is False


@pytest.mark.parametrize(("aad", "aad_size"), [(b"", 1), (b"a" * 63, 1), (b"a" * 64, 2), (b"a" * 5, 4)])
def test_public_message_authenticated_data_is_skipped(aad: bytes, aad_size: int) -> None:
    assert is_commit_or_proposal(public(2, 2, aad=aad, aad_size=aad_size)) is True
    assert is_commit_or_proposal(public(1, 2, aad=aad, aad_size=aad_size)) is False


# --- what is not a commit: fail open ----------------------------------------------------------------


def test_invalid_prefix_11_is_not_a_commit() -> None:
    framed = u16(1) + u16(2) + bytes([0xC0 | 16]) + GROUP_ID + EPOCH + b"\x03"
    assert is_commit_or_proposal(framed) is False
    framed = u16(1) + u16(1) + vector(GROUP_ID, 1) + EPOCH + b"\x01\x00\x00\x00\x01" + b"\xc0" + b"\x03"
    assert is_commit_or_proposal(framed) is False


@pytest.mark.parametrize("version", [0, 2, 0x0100, 0xFFFF])
def test_wrong_version_is_not_a_commit(version: int) -> None:
    assert is_commit_or_proposal(private(3, version=version)) is False


@pytest.mark.parametrize("wire_format", [0, 3, 4, 5, 6, 0x0102])
def test_other_wire_formats_are_not_commits(wire_format: int) -> None:
    # What follows would read as a commit if the wire format were 2.
    framed = u16(1) + u16(wire_format) + vector(GROUP_ID, 1) + EPOCH + b"\x03" + b"\x00" * 40
    assert is_commit_or_proposal(framed) is False


@pytest.mark.parametrize(
    "framed", [private(3), private(2, size=4), public(3, 1), public(2, 3, aad=b"x" * 70, aad_size=2)]
)
def test_every_truncation_is_not_a_commit(framed: bytes) -> None:
    # Cut anywhere before the content type: never a commit, never an exception.
    content_type_at = next(i for i in range(len(framed)) if is_commit_or_proposal(framed[: i + 1]))
    for cut in range(content_type_at + 1):
        assert is_commit_or_proposal(framed[:cut]) is False, cut
    assert is_commit_or_proposal(framed[: content_type_at + 1]) is True


def test_group_id_longer_than_the_data_is_not_a_commit() -> None:
    framed = u16(1) + u16(2) + bytes([0x40 | 0x3F, 0xFF]) + GROUP_ID + EPOCH + b"\x03"
    assert is_commit_or_proposal(framed) is False


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x01", b"\x00\x01\x00", b"\xff" * 64, bytes(200)])
def test_junk_is_not_a_commit(data: bytes) -> None:
    assert is_commit_or_proposal(data) is False
