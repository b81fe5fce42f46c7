"""What a process's /readyz checks and what its /metrics reads just before a scrape.

Every long-running command serves /healthz, /readyz and /metrics; each says here what "ready"
means for it (the API: the database and Redis answer; a worker: Redis answers, its providers
are built and the read replica answers when one is configured) and which gauges are read from
outside the process at scrape time (queue depths). The HTTP side lives in app/api/health.py; a
process with an HTTP app of its own includes that router and sets these probes on its app's state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

Check = Callable[[], Awaitable[bool]]
CHECK_SECONDS = 2.0
# A scrape waits this long at most for the gauges read from outside (Redis).
SAMPLE_SECONDS = 2.0


async def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Probes:
    # name -> an answer within CHECK_SECONDS that the dependency is usable
    checks: Mapping[str, Check] = field(default_factory=dict)
    # sets the gauges read from outside the process; run before each scrape
    sample: Callable[[], Awaitable[None]] = _nothing

    async def readiness(self) -> dict[str, str]:
        """Each check's verdict, `ok` or `unavailable`, all run at once."""
        names = list(self.checks)
        verdicts = await asyncio.gather(*(_verdict(self.checks[name]) for name in names))
        return dict(zip(names, verdicts, strict=True))

    async def sample_gauges(self) -> None:
        """Refresh the sampled gauges; on trouble they keep their last values (telemetry only)."""
        with contextlib.suppress(Exception):  # a scrape answers with what it has
            await asyncio.wait_for(self.sample(), SAMPLE_SECONDS)


async def _verdict(check: Check) -> str:
    try:
        ok = await asyncio.wait_for(check(), CHECK_SECONDS)
    except Exception:
        ok = False
    return "ok" if ok else "unavailable"
