"""Long-running commands of the console script as child processes of the test's event loop: their
output is read as it comes, their probe port found in their log, and they always end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import httpx

from tests.support.ops import ROOT, command

START_SECONDS = 60.0
STOP_SECONDS = 30.0
PROBE_PORT = re.compile(r"serving metrics=\S*:(\d+)")


def clean_env(**settings: str) -> dict[str, str]:
    """The current environment without any XMTP_PUSH_* variable, plus `settings`."""
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("XMTP_PUSH_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings)
    return env


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def output(self) -> str:
        return f"--- {self.name} (exit {self.process.returncode})\n" + "\n".join(self.lines[-60:])

    async def line(self, pattern: re.Pattern[str], timeout: float = START_SECONDS) -> re.Match[str]:
        """The first line of its output matching `pattern`, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for text in self.lines:
                if found := pattern.search(text):
                    return found
            if self.process.returncode is not None:
                raise AssertionError(f"{self.name} exited before logging {pattern.pattern}\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} logged no {pattern.pattern} in {timeout} s\n{self.output()}"
                )
            await asyncio.sleep(0.05)

    async def probe_port(self) -> int:
        return int((await self.line(PROBE_PORT)).group(1))

    async def stop(self) -> int:
        """SIGTERM, then wait; killed (and the test failed) if it does not end in time."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), STOP_SECONDS)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(
                f"{self.name} did not stop within {STOP_SECONDS} s\n{self.output()}"
            ) from None
        if self.reader is not None:
            await self.reader
        return self.process.returncode


def json_lines(lines: Iterable[str]) -> list[dict[str, object]]:
    """The JSON log lines among `lines` (anything else printed is left out)."""
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return [event for event in found if isinstance(event, dict)]


def events(process: Child) -> list[dict[str, object]]:
    """The JSON log lines of the process."""
    return json_lines(process.lines)


@asynccontextmanager
async def child(
    name: str, args: list[str], env: dict[str, str], wrapper: Sequence[str] = ()
) -> AsyncIterator[Child]:
    """`xmtp-push ARGS` with `env` (run through `wrapper`, a command that execs its arguments, when
    given), output (stdout and stderr) collected line by line."""
    process = await asyncio.create_subprocess_exec(
        *wrapper,
        *command(),
        *args,
        env=env,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    started = Child(name, process)
    started.reader = asyncio.create_task(started._read())
    try:
        yield started
    finally:
        if process.returncode is None:
            with suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        await started.reader


async def wait_answering(url: str, timeout: float = START_SECONDS) -> httpx.Response:
    """GET `url` until it answers at all (any status)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            try:
                return await client.get(url)
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
