"""What the fake network nodes (xmtpd, node-go) share: a gRPC server on a loopback port, the streams
open on it, and waiting until they are as a test wants."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sized

import grpc


class StreamingNode:
    def __init__(self, streams: Sized) -> None:
        self.port = 0  # 0 until started: the OS picks one
        self._server: grpc.aio.Server | None = None
        self._open: Sized = streams  # the node's open streams, however it keeps them
        self._changed = asyncio.Condition()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_streams(self) -> int:
        return len(self._open)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (bounded) until predicate() holds, re-checking whenever a stream opens or closes."""
        deadline = time.monotonic() + timeout
        async with self._changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    name = type(self).__name__
                    raise AssertionError(f"{name}: timed out after {timeout:.1f} s waiting for {what}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
