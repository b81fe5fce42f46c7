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


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length", "")
    return int(raw) if raw.isdigit() else None


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
