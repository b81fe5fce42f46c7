"""A Redis server of the test's own, on a port of its choosing, that the test may kill and start again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.ops import required_tool


@asynccontextmanager
async def redis_server(port: int, keeps_in: Path | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """Redis on `port`, stopped on the way out; with `keeps_in`, it keeps its data there (AOF), else
    nothing on disk."""
    persistence = (
        ("--appendonly", "no") if keeps_in is None else ("--appendonly", "yes", "--dir", str(keeps_in))
    )
    server = await asyncio.create_subprocess_exec(
        required_tool("redis-server", "redis-server"),
        *("--port", str(port), "--bind", "127.0.0.1", "--save", ""),
        *persistence,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield server
    finally:
        if server.returncode is None:
            server.terminate()
            await server.wait()
