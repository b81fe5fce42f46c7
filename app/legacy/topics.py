"""Legacy topic strings and the binary topics of the rest of the product, one to one.

Contract: docs/legacy.md#topics. A legacy subscription names a topic by its string; an envelope
carries the kind byte and identifier. Only group (kind 0, 16 bytes) and welcome (kind 1, 32 bytes)
topics have a legacy form.
"""

from __future__ import annotations

import re

GROUP_KIND, WELCOME_KIND = 0, 1
GROUP_ID_BYTES, INSTALLATION_KEY_BYTES = 16, 32
CONVERSATION, WELCOME = "v3-conversation", "v3-welcome"

_PREFIX, _SUFFIX = "/xmtp/mls/1/", "/proto"
# Lowercase hex only: the string is matched exactly, so an uppercase form would be another topic.
_TOPIC = re.compile(r"/xmtp/mls/1/(?:g-([0-9a-f]{32})|w-([0-9a-f]{64}))/proto")
_LETTERS = {GROUP_KIND: ("g", GROUP_ID_BYTES), WELCOME_KIND: ("w", INSTALLATION_KEY_BYTES)}


def to_bytes(topic: str) -> bytes | None:
    """The binary topic of a legacy topic string; None for a string of neither form."""
    match = _TOPIC.fullmatch(topic)
    if match is None:
        return None
    group, welcome = match.groups()
    if group is not None:
        return bytes([GROUP_KIND]) + bytes.fromhex(group)
    return bytes([WELCOME_KIND]) + bytes.fromhex(welcome)


def to_string(topic: bytes) -> str | None:
    """The legacy topic string of a binary topic; None for another kind or length."""
    if not topic:
        return None
    form = _LETTERS.get(topic[0])
    if form is None or len(topic) != 1 + form[1]:
        return None
    return f"{_PREFIX}{form[0]}-{topic[1:].hex()}{_SUFFIX}"


def message_kind(topic: str) -> str | None:
    """What the payloads call the topic's messages: `v3-conversation` or `v3-welcome`."""
    match = _TOPIC.fullmatch(topic)
    if match is None:
        return None
    return CONVERSATION if match.group(1) is not None else WELCOME
