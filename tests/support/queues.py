"""A work queue that refuses adds while told, for the loops that must keep what they could not queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError


class FailingAdds:
    """A work queue (the one given underneath) whose adds to `stream` fail while told, as Redis does
    when it is unreachable."""

    def __init__(self, inner: Any, stream: str) -> None:
        self.inner, self.stream = inner, stream
        self.failing = False
        self.failed = 0

    async def add_each(self, stream: str, parts: Mapping[int, Sequence[bytes]]) -> None:
        if self.failing and stream == self.stream:
            self.failed += 1
            raise RedisConnectionError("queue unreachable")
        await self.inner.add_each(stream, parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
