"""Legacy topic strings and the binary topics they name (docs/legacy.md#topics)."""

from __future__ import annotations

import re

GROUP_KIND, WELCOME_KIND = 0x00, 0x01
_FORMS = {GROUP_KIND: ("g", 16), WELCOME_KIND: ("w", 32)}
_STRING = re.compile(r"/xmtp/mls/1/([gw])-((?:[0-9a-f]{2})+)/proto")
_KINDS = {"g": "v3-conversation", "w": "v3-welcome"}


def to_bytes(topic: str) -> bytes | None:
    """The binary topic a legacy string names; None for a string of neither form."""
    match = _STRING.fullmatch(topic)
    if match is None:
        return None
    letter, identifier = match.groups()
    kind = GROUP_KIND if letter == "g" else WELCOME_KIND
    if len(identifier) != 2 * _FORMS[kind][1]:
        return None
    return bytes([kind]) + bytes.fromhex(identifier)


def to_string(topic: bytes) -> str | None:
    """The legacy string of a binary topic; None for another kind or length."""
    form = _FORMS.get(topic[0]) if topic else None
    if form is None or len(topic) != 1 + form[1]:
        return None
    return f"/xmtp/mls/1/{form[0]}-{topic[1:].hex()}/proto"


def message_kind(topic: str) -> str | None:
    """What a push says the message is: "v3-conversation" (group) or "v3-welcome"."""
    match = _STRING.fullmatch(topic)
    return _KINDS[match.group(1)] if match is not None and to_bytes(topic) is not None else None
