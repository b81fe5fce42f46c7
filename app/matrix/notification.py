"""A notify request's body, checked field by field against the Push Gateway API's tables.

A body that does not parse is M_NOT_JSON; a body of the wrong shape (no `notification` object, no
devices, a field of the wrong type) is M_BAD_JSON. Messages name the field, never its value. Rules
about one device that make only that device unusable (its app id, its pushkey, its pusher data) are
not checked here: they put its pushkey in `rejected` (app.matrix.service).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NOT_JSON, BAD_JSON = "M_NOT_JSON", "M_BAD_JSON"
PRIORITIES = ("high", "low")
# notification field -> the JSON types it may hold (the Push Gateway API's table; "type" and "sender" may be
# null: a homeserver's badge-only update sends them so).
STRING, NULLABLE_STRING, OBJECT, BOOLEAN = (str,), (str, type(None)), (dict,), (bool,)
NOTIFICATION_FIELDS: dict[str, tuple[type, ...]] = {
    "event_id": STRING,
    "room_id": STRING,
    "type": NULLABLE_STRING,
    "sender": NULLABLE_STRING,
    "sender_display_name": STRING,
    "room_name": STRING,
    "room_alias": STRING,
    "membership": STRING,
    "user_is_target": BOOLEAN,
    "prio": STRING,
    "content": OBJECT,
    "counts": OBJECT,
}
DEVICE_FIELDS: dict[str, tuple[type, ...]] = {
    "app_id": STRING,
    "pushkey": STRING,
    "pushkey_ts": (int,),
    "data": OBJECT,
    "tweaks": OBJECT,
}


class BadNotification(Exception):
    """The body is refused with 400 and this Matrix error code; the message names the field."""

    def __init__(self, errcode: str, message: str) -> None:
        super().__init__(message)
        self.errcode = errcode


@dataclass(frozen=True, slots=True)
class Device:
    app_id: str
    pushkey: str
    pushkey_ts: int
    data: Mapping[str, Any]  # the pusher's data minus its url: format, default_payload, ...


@dataclass(frozen=True, slots=True)
class Notification:
    devices: tuple[Device, ...]
    event_id: str | None = None
    room_id: str | None = None
    type: str | None = None
    sender: str | None = None
    sender_display_name: str | None = None
    room_name: str | None = None
    room_alias: str | None = None
    membership: str | None = None
    user_is_target: bool | None = None
    prio: str = "high"
    content: Mapping[str, Any] | None = None
    unread: int | None = None
    missed_calls: int | None = None


def parse_notification(body: bytes) -> Notification:
    """The notification of a request body, or BadNotification."""
    document = _json(body)
    raw = document.get("notification") if isinstance(document, dict) else None
    if not isinstance(raw, dict):
        raise BadNotification(BAD_JSON, "notification: expected an object")
    fields = {
        name: _checked(raw, name, types, "notification.") for name, types in NOTIFICATION_FIELDS.items()
    }
    prio = fields.pop("prio")
    if prio is not None and prio not in PRIORITIES:
        raise BadNotification(BAD_JSON, "notification.prio: expected 'high' or 'low'")
    counts = fields.pop("counts") or {}
    return Notification(
        devices=_devices(raw.get("devices")),
        prio=prio or "high",
        unread=_count(counts, "unread"),
        missed_calls=_count(counts, "missed_calls"),
        **fields,
    )


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadNotification(NOT_JSON, "body: not JSON") from None
    except RecursionError:  # the parser's nesting bound
        raise BadNotification(NOT_JSON, "body: JSON nested too deeply") from None


def _checked(raw: Mapping[str, Any], name: str, types: tuple[type, ...], where: str) -> Any:
    value = raw.get(name)
    if value is None and name not in raw:
        return None
    # JSON true/false are bools, which Python also counts as ints.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BadNotification(BAD_JSON, f"{where}{name}: expected {_type_name(types)}")
    return value


def _type_name(types: tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", bool: "a boolean", int: "an integer", type(None): "null"}
    return " or ".join(names[t] for t in types)


def _count(counts: Mapping[str, Any], name: str) -> int | None:
    value = counts.get(name)
    if value is None:
        return None  # zero counts may be left out
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadNotification(BAD_JSON, f"notification.counts.{name}: expected an integer")
    return value


def _devices(raw: Any) -> tuple[Device, ...]:
    if not isinstance(raw, list) or not raw:
        raise BadNotification(BAD_JSON, "notification.devices: expected a non-empty array")
    devices = []
    for index, entry in enumerate(raw):
        where = f"notification.devices[{index}]."
        if not isinstance(entry, dict):
            raise BadNotification(BAD_JSON, f"{where[:-1]}: expected an object")
        fields = {name: _checked(entry, name, types, where) for name, types in DEVICE_FIELDS.items()}
        for required in ("app_id", "pushkey"):
            if fields[required] is None:
                raise BadNotification(BAD_JSON, f"{where}{required}: required")
        devices.append(
            Device(fields["app_id"], fields["pushkey"], fields["pushkey_ts"] or 0, fields["data"] or {})
        )
    return tuple(devices)
