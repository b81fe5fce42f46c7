"""Legacy topic strings and binary topics, one to one.

Contract: docs/legacy.md#topics.
"""

from __future__ import annotations

import pytest

from app.legacy import topics

GROUP_ID = bytes(range(16))
INSTALLATION_KEY = bytes(range(0xA0, 0xC0))
GROUP_TOPIC = "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e0f/proto"
WELCOME_TOPIC = "/xmtp/mls/1/w-a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf/proto"


def test_a_group_topic_is_kind_0_and_its_group_id() -> None:
    assert topics.to_bytes(GROUP_TOPIC) == b"\x00" + GROUP_ID
    assert topics.to_string(b"\x00" + GROUP_ID) == GROUP_TOPIC
    assert topics.message_kind(GROUP_TOPIC) == "v3-conversation"


def test_a_welcome_topic_is_kind_1_and_its_installation_key() -> None:
    assert topics.to_bytes(WELCOME_TOPIC) == b"\x01" + INSTALLATION_KEY
    assert topics.to_string(b"\x01" + INSTALLATION_KEY) == WELCOME_TOPIC
    assert topics.message_kind(WELCOME_TOPIC) == "v3-welcome"


@pytest.mark.parametrize(
    "topic",
    [
        "/xmtp/mls/1/g-000102030405060708090A0B0C0D0E0F/proto",  # uppercase hex is another string
        "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e/proto",  # 15 bytes
        "/xmtp/mls/1/w-000102030405060708090a0b0c0d0e0f/proto",  # a welcome needs 32 bytes
        "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e0f/proto\n",
        "/xmtp/0/invite-0x1234/proto",  # a V2 topic: never pushed
        "/xmtp/mls/1/i-000102030405060708090a0b0c0d0e0f/proto",
        "",
    ],
)
def test_a_string_of_neither_form_has_no_binary_topic(topic: str) -> None:
    assert topics.to_bytes(topic) is None
    assert topics.message_kind(topic) is None


@pytest.mark.parametrize(
    "topic",
    [
        b"",
        b"\x00" + bytes(15),
        b"\x00" + bytes(17),
        b"\x01" + bytes(16),
        b"\x02" + bytes(32),
        b"\x03" + bytes(32),
    ],
)
def test_a_binary_topic_of_another_kind_or_length_has_no_string(topic: bytes) -> None:
    assert topics.to_string(topic) is None


def test_every_binary_topic_comes_back_from_its_string() -> None:
    for topic in (b"\x00" + bytes([n] * 16) for n in range(256)):
        string = topics.to_string(topic)
        assert string is not None and topics.to_bytes(string) == topic
