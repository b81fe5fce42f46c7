"""An APNs body kept within Apple's 4096 bytes by shortening its text fields, as Sygnal does.

The fields that may be shortened are the alert (when a string), the alert's `body` and each of its
`loc-args`. While the JSON is too long, the longest of them (by UTF-8 bytes; the first of equals)
loses its last character. The greedy rule is simulated with each character's cost in the JSON,
not by re-encoding the payload per character, so a huge field costs one pass.
"""

from __future__ import annotations

import copy
import functools
import heapq
import json
from collections.abc import MutableMapping, MutableSequence
from typing import Any

MAX_BODY_BYTES = 4096


class BodyTooLong(Exception):
    """Even with every field shortened to nothing, the body is over the limit."""


def encode(payload: Any) -> bytes:
    """The body as it is sent (and as its length is measured)."""
    return json.dumps(payload, ensure_ascii=False).encode()


def shortened_body(payload: dict[str, Any], limit: int = MAX_BODY_BYTES) -> bytes:
    body = encode(payload)
    if len(body) <= limit:
        return body
    payload = copy.deepcopy(payload)
    slots = _choppable(payload.get("aps"))
    texts = [container[key] for container, key in slots]
    ends = _ends(texts, len(body) - limit)
    for (container, key), text, end in zip(slots, texts, ends, strict=True):
        container[key] = text[:end]
    return encode(payload)


def _choppable(aps: Any) -> list[tuple[Any, Any]]:
    """(container, key) of each text field that may be shortened, in Sygnal's order."""
    if not isinstance(aps, MutableMapping) or "alert" not in aps:
        return []
    alert = aps["alert"]
    if isinstance(alert, str):
        return [(aps, "alert")]
    if not isinstance(alert, MutableMapping):
        return []
    slots: list[tuple[Any, Any]] = []
    if isinstance(alert.get("body"), str):
        slots.append((alert, "body"))
    args = alert.get("loc-args")
    if isinstance(args, MutableSequence):
        slots.extend((args, index) for index, arg in enumerate(args) if isinstance(arg, str))
    return slots


def _ends(texts: list[str], excess: int) -> list[int]:
    """How many characters of each text remain once `excess` bytes of JSON are gone."""
    ends = [len(text) for text in texts]
    sizes = [len(text.encode()) for text in texts]
    heap = [(-size, index) for index, size in enumerate(sizes) if size > 0]
    heapq.heapify(heap)
    while excess > 0:
        if not heap:
            raise BodyTooLong
        _, index = heapq.heappop(heap)
        rival = heap[0] if heap else (0, len(texts))
        text = texts[index]
        # Shorten this one for as long as it stays the longest (first among equals).
        while excess > 0 and sizes[index] > 0 and (-sizes[index], index) < rival:
            ends[index] -= 1
            char = text[ends[index]]
            sizes[index] -= len(char.encode())
            excess -= _json_size(char)
        if sizes[index] > 0:
            heapq.heappush(heap, (-sizes[index], index))
    return ends


@functools.lru_cache(maxsize=4096)
def _json_size(char: str) -> int:
    """The bytes one character takes inside a JSON string (escapes included)."""
    return len(json.dumps(char, ensure_ascii=False).encode()) - 2
