"""Talking to the receiver process (`bench.receiver`) over its control routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from typing import Any

import aiohttp


def _load_json(path: str) -> Any:
    with open(path) as file:
        return json.load(file)


class ReceiverClient:
    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def count(self) -> int:
        async with self.session.get(self.base + "/stats") as response:
            return int((await response.json())["count"])

    async def reset(self) -> None:
        async with self.session.post(self.base + "/reset") as response:
            response.raise_for_status()

    async def dump(self) -> dict[str, Any]:
        handle, path = tempfile.mkstemp(prefix="bench-receiver-", suffix=".json")
        os.close(handle)
        try:
            async with self.session.post(
                self.base + "/dump", data=path.encode(), timeout=aiohttp.ClientTimeout(total=300)
            ) as response:
                response.raise_for_status()
            return await asyncio.to_thread(_load_json, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def wait_for(self, expected: int, stall_seconds: float, poll: float = 0.1) -> tuple[int, float]:
        """Poll until `expected` arrivals or no progress for stall_seconds; (count, monotonic when done)."""
        last, last_change = -1, time.monotonic()
        while True:
            count = await self.count()
            now = time.monotonic()
            if count >= expected:
                return count, now
            if count != last:
                last, last_change = count, now
            elif now - last_change > stall_seconds:
                return count, now
            await asyncio.sleep(poll)
