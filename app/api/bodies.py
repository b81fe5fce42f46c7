"""Request bodies read with a bound on size and time, while they stream in.

A declared Content-Length over the limit is refused before anything is read; a body that streams
past the limit is refused at the chunk that crosses it, so a client can make the process hold at
most `limit` bytes of its body. A body that trickles is given up after `seconds`. Beyond its first
window a body is read under one of the process's read slots (`ReadSlots`), so that all the bodies
being read at once hold a bounded total, however many connections send them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request

from app.api.read_slots import ReadSlots


class BodyTooLarge(Exception):
    """The body is over the route's limit; nothing of it was used."""


class BodyTooSlow(Exception):
    """The body did not arrive within the route's time bound."""


# More digits than any body we take could need: read as "too large" without converting them
# (Python refuses to convert over 4,300 digits, which would be a 500 for what a client sent).
MAX_LENGTH_DIGITS = 18
# What a body may hold before it needs a read slot: uvicorn stops reading a connection while this
# much waits unread, so a request waiting for a slot holds no more.
FIRST_WINDOW_BYTES = 64 * 1024


def declared_length(request: Request) -> int | None:
    return content_length(request.headers.get("content-length", "").encode())


def content_length(raw: bytes) -> int | None:
    """A Content-Length header's value as a number of bytes; None when absent or not a number."""
    if not raw.isdigit():
        return None
    return int(raw) if len(raw) <= MAX_LENGTH_DIGITS else 10**MAX_LENGTH_DIGITS


async def read_body(request: Request, limit: int, seconds: float) -> bytes:
    """The whole body, or BodyTooLarge / BodyTooSlow (the wait for a read slot counts)."""
    slots: ReadSlots | None = getattr(request.app.state, "read_slots", None)
    try:
        async with asyncio.timeout(seconds):
            return await collect_chunks(request.stream(), declared_length(request), limit, slots)
    except TimeoutError:
        raise BodyTooSlow from None


async def collect_chunks(
    stream: AsyncIterator[bytes], declared: int | None, limit: int, slots: ReadSlots | None = None
) -> bytes:
    """A body from its chunks as they arrive, and the length its headers declared (if any), or
    BodyTooLarge; past its first window under a read slot of `slots`; bounded in time by the caller."""
    if declared is not None and declared > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async with contextlib.AsyncExitStack() as held:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if slots is not None and size > FIRST_WINDOW_BYTES:
                await held.enter_async_context(slots.slot())
                slots = None  # held until the body is read
    return b"".join(chunks)
