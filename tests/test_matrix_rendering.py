"""Pushes rendered as Sygnal renders them: APNs alerts per event type, the 4096-byte shortening rule
(checked against a plain, slow statement of the rule), and FCM fields cut at 1024 bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from app.matrix.apns_app import alert_for, payload_for
from app.matrix.duplicates import ProcessMemory, delivery_key
from app.matrix.gcm_app import data_for
from app.matrix.notification import Device, Notification
from app.matrix.truncation import BodyTooLong, shortened_body


def reference_shortening(payload: dict[str, Any], limit: int) -> bytes:
    """The rule as stated: while too long, the longest shortenable field (by UTF-8 bytes, the first of
    equals) loses its last character. One JSON encoding per character: fine for small cases."""

    def encoded() -> bytes:
        return json.dumps(payload, ensure_ascii=False).encode()

    alert = payload["aps"]["alert"]
    slots: list[tuple[Any, Any]] = [(alert, "body")] if "body" in alert else []
    slots += [(alert["loc-args"], i) for i in range(len(alert.get("loc-args", [])))]
    while len(encoded()) > limit:
        longest, size = None, 0
        for container, key in slots:
            length = len(container[key].encode())
            if length > size:
                longest, size = (container, key), length
        if longest is None:
            raise BodyTooLong
        container, key = longest
        container[key] = container[key][:-1]
    return encoded()


ALPHABET = ["a", "é", "€", "😀", '"', "\\", "\n", "\x01", " "]


@pytest.mark.parametrize("seed", range(40))
def test_shortening_matches_the_rule(seed: int) -> None:
    chance = random.Random(seed)

    def text() -> str:
        return "".join(chance.choice(ALPHABET) for _ in range(chance.randrange(0, 300)))

    alert: dict[str, Any] = {"loc-key": "K", "loc-args": [text() for _ in range(chance.randrange(1, 4))]}
    if chance.random() < 0.5:
        alert["body"] = text()
    payload = {"aps": {"alert": alert, "badge": 1}, "room_id": "!r"}
    limit = chance.randrange(60, 600)
    try:
        expected = reference_shortening(json.loads(json.dumps(payload)), limit)
    except BodyTooLong:
        with pytest.raises(BodyTooLong):
            shortened_body(payload, limit)
        return
    assert shortened_body(payload, limit) == expected
    assert len(expected) <= limit


def test_a_payload_without_alert_fields_cannot_be_shortened() -> None:
    assert shortened_body({"a": "b"}, 100) == b'{"a": "b"}'
    with pytest.raises(BodyTooLong):
        shortened_body({"blob": "x" * 200}, 100)
    with pytest.raises(BodyTooLong):
        shortened_body({"aps": {"alert": {"loc-key": "K" * 200}}}, 100)  # loc-key is not shortened


def test_a_huge_field_is_shortened_in_one_pass() -> None:
    body = shortened_body({"aps": {"alert": {"loc-args": ["x" * 500_000, "y"]}}}, 4096)
    assert len(body) == 4096


def note(**fields: Any) -> Notification:
    return Notification(devices=(Device("a", "k", 0, {}),), **fields)


ALERTS: list[tuple[dict[str, Any], tuple[str | None, list[Any] | None]]] = [
    (
        {"type": "m.room.message", "sender": "@a:x", "content": {"msgtype": "m.image", "body": "cat.png"}},
        ("IMAGE_FROM_USER", ["@a:x", "cat.png"]),
    ),
    (
        {
            "type": "m.room.message",
            "sender_display_name": "A",
            "room_alias": "#r:x",
            "content": {"msgtype": "m.emote", "body": "waves"},
        },
        ("ACTION_FROM_USER_IN_ROOM", ["#r:x", "A", "waves"]),
    ),
    (
        {"type": "m.room.encrypted", "sender": "@a:x", "room_name": "R"},
        ("MSG_FROM_USER_IN_ROOM", ["@a:x", "R"]),
    ),
    ({"type": "m.room.message"}, ("MSG_FROM_USER", [" "])),
    (
        {"type": "m.call.invite", "sender": "@a:x", "content": {"offer": {"sdp": "v=0\r\nm=video 9"}}},
        ("VIDEO_CALL_FROM_USER", ["@a:x"]),
    ),
    (
        {"type": "m.call.invite", "sender": "@a:x", "content": {"offer": "x"}},
        ("VOICE_CALL_FROM_USER", ["@a:x"]),
    ),
    (
        {
            "type": "m.room.member",
            "sender": "@a:x",
            "membership": "invite",
            "user_is_target": True,
            "room_name": "R",
        },
        ("USER_INVITE_TO_NAMED_ROOM", ["@a:x", "R"]),
    ),
    (
        {"type": "m.room.member", "sender": "@a:x", "membership": "invite", "user_is_target": True},
        ("USER_INVITE_TO_CHAT", ["@a:x"]),
    ),
    ({"type": "m.room.member", "membership": "join", "user_is_target": True}, (None, None)),
    ({"type": "m.sticker", "sender": "@a:x"}, ("MSG_FROM_USER", ["@a:x"])),
    (
        {"type": "m.room.message", "sender": "@a:x", "sender_display_name": "B" * 2000},
        ("MSG_FROM_USER", ["B" * 1024]),
    ),
]


@pytest.mark.parametrize(("fields", "expected"), ALERTS, ids=[e[0] or "none" for _, e in ALERTS])
def test_alerts_per_event_type(fields: dict[str, Any], expected: tuple[str | None, list[Any] | None]) -> None:
    assert alert_for(note(**fields)) == expected


def test_a_full_event_with_no_alert_and_no_counts_sends_nothing() -> None:
    notification = note(type="m.room.member", membership="join", event_id="$e")
    assert payload_for(notification, notification.devices[0]) is None


def test_full_format_starts_from_default_payload() -> None:
    notification = note(type="m.room.message", sender="@a:x", event_id="$e", room_id="!r", unread=1)
    device = Device("a", "k", 0, {"default_payload": {"aps": {"sound": "x"}, "extra": 1}})
    assert payload_for(notification, device) == {
        "aps": {"sound": "x", "alert": {"loc-key": "MSG_FROM_USER", "loc-args": ["@a:x"]}, "badge": 1},
        "extra": 1,
        "room_id": "!r",
        "event_id": "$e",
    }


def test_fcm_fields_are_cut_at_1024_bytes_on_a_character_boundary() -> None:
    notification = note(event_id="$e", room_name="é" * 600, content={"body": "€" * 400, "n": 1})
    data = data_for(notification, notification.devices[0])
    assert data["room_name"] == "é" * 510 + "…"  # 1020 bytes of whole characters, then the mark
    assert data["content_body"] == "€" * 340 + "…"
    assert "content_n" not in data and "unread" not in data and "missed_calls" not in data


async def test_the_process_memory_forgets_after_its_window_and_past_its_limit() -> None:
    now = [0.0]
    memory = ProcessMemory(window=600, limit=3, clock=lambda: now[0])
    first, second = delivery_key("app", "key", "$1"), delivery_key("app", "key", "$2")
    assert first != second and first != delivery_key("app", "key$", "1")  # parts cannot run together
    await memory.remember(first)
    now[0] = 599.0
    assert await memory.delivered(first) and not await memory.delivered(second)
    now[0] = 600.5
    assert not await memory.delivered(first)  # ten minutes on
    for index in range(5):
        await memory.remember(delivery_key("app", "key", f"${index}"))
    assert not await memory.delivered(delivery_key("app", "key", "$0"))  # the oldest went first
    assert await memory.delivered(delivery_key("app", "key", "$4"))
