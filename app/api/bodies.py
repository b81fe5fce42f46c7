"""Request bodies read with a bound on size and time, while they stream in.

A declared Content-Length over the limit is refused before anything is read; a body that streams
past the limit is refused at the chunk that crosses it, so a client can make the process hold at
most `limit` bytes of its body. A body that trickles is given up after `seconds`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request


class BodyTooLarge(Exception):
    """The body is over the route's limit; nothing of it was used."""


class BodyTooSlow(Exception):
    """The body did not arrive within the route's time bound."""


# More digits than any body we take could need: read as "too large" without converting them
# (Python refuses to convert over 4,300 digits, which would be a 500 for what a client sent).
MAX_LENGTH_DIGITS = 18


def declared_length(request: Request) -> int | None:
    return content_length(request.headers.get("content-length", "").encode())


def content_length(raw: bytes) -> int | None:
    """A Content-Length header's value as a number of bytes; None when absent or not a number."""
    if not raw.isdigit():
        return None
    return int(raw) if len(raw) <= MAX_LENGTH_DIGITS else 10**MAX_LENGTH_DIGITS


async def read_body(request: Request, limit: int, seconds: float) -> bytes:
    """The whole body, or BodyTooLarge / BodyTooSlow."""
    try:
        async with asyncio.timeout(seconds):
            return await collect_chunks(request.stream(), declared_length(request), limit)
    except TimeoutError:
        raise BodyTooSlow from None


async def collect_chunks(stream: AsyncIterator[bytes], declared: int | None, limit: int) -> bytes:
    """A body from its chunks as they arrive, and the length its headers declared (if any), or
    BodyTooLarge; bounded in time by the caller."""
    if declared is not None and declared > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)
