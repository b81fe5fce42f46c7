"""Unique ids made cheaply, for requests sent (APNs's apns-id) and answered (x-request-id)."""

from __future__ import annotations

import itertools
import secrets
import uuid


class UuidSequence:
    """Canonical UUIDs, each a random one made once with a counter in its last 48 bits, rather than a
    fresh uuid4 each (a system call and an object each time)."""

    def __init__(self) -> None:
        self._prefix = str(uuid.uuid4())[:24]  # through the variant group, with its hyphen
        self._counter = itertools.count(secrets.randbelow(1 << 40))

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFFFFFFFFFF:012x}"
