"""The benchmarks' child processes: start one and wait for the line that says it is ready, stop it;
and the command line and environment the backend's processes (`xmtp-push ...`) start with."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass

# What `xmtp-push api` and `xmtp-push dev` log once both servers listen.
SERVING = re.compile(r"serving http=\S*:(\d+) grpc=\S*:(\d+)")
READY_SECONDS = 60.0
STOP_SECONDS = 30.0
ERROR_MARKERS = (" ERROR ", "Traceback", "CRITICAL", '"level": "error"', '"level":"error"')
PR_SET_PDEATHSIG = 1


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    tail: collections.deque[str]  # its latest output lines
    drainer: asyncio.Task[None]
    match: re.Match[str]  # the ready line

    @property
    def pid(self) -> int:
        return self.process.pid


def die_with_parent() -> None:
    """preexec_fn for the benchmark's child processes: the kernel sends SIGTERM to the child when
    the benchmark process dies, however it dies. A worker left behind by a killed run would go on
    consuming the next run's Redis DB against a dropped database."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: children may outlive a killed run
        pass


def xmtp_push_command() -> list[str]:
    """The console script of this interpreter's environment, else the first on PATH, else the module."""
    script = os.path.join(os.path.dirname(sys.executable), "xmtp-push")
    if os.path.exists(script):
        return [script]
    found = shutil.which("xmtp-push")
    return [found] if found else [sys.executable, "-m", "workers.cli"]


def server_env(database_url: str) -> dict[str, str]:
    """This environment without any XMTP_PUSH_* setting, plus what a local benchmark server needs:
    the database, HTTP, gRPC and metrics on free ports of 127.0.0.1, and webhooks to local plain-HTTP receivers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_")}
    env.update(
        {
            "XMTP_PUSH_DATABASE_URL": database_url,
            "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
            "XMTP_PUSH_HTTP_PORT": "0",
            "XMTP_PUSH_GRPC_HOST": "127.0.0.1",
            "XMTP_PUSH_GRPC_PORT": "0",
            "XMTP_PUSH_METRICS_PORT": "0",
            "XMTP_PUSH_HTTP_ENABLED": "true",
            "XMTP_PUSH_HTTP_ALLOW_INSECURE": "true",
            "XMTP_PUSH_HTTP_ALLOW_PRIVATE_ADDRESSES": "true",
        }
    )
    return env


async def start_process(
    name: str, command: list[str], env: dict[str, str], ready: re.Pattern[str], *, cwd: str | None = None
) -> Proc:
    """Start `command` and wait until a line of its output (stdout and stderr) matches `ready`."""
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    tail: collections.deque[str] = collections.deque(maxlen=200)
    found: asyncio.Future[re.Match[str]] = asyncio.get_running_loop().create_future()
    # Read the output for the process's whole life, so that a full pipe never blocks it.
    drainer = asyncio.create_task(_drain(name, process, tail, ready, found))
    try:
        matched = await asyncio.wait_for(found, timeout=READY_SECONDS)
    except Exception:
        print(f"{name} output tail:\n" + "\n".join(tail), file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    return Proc(name, process, tail, drainer, matched)


async def _drain(
    name: str,
    process: asyncio.subprocess.Process,
    tail: collections.deque[str],
    ready: re.Pattern[str],
    found: asyncio.Future[re.Match[str]],
) -> None:
    assert process.stdout is not None
    async for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        matched = ready.search(line)
        if matched and not found.done():
            found.set_result(matched)
    if not found.done():
        found.set_exception(RuntimeError(f"{name} exited before it was ready"))


async def stop_process(proc: Proc) -> int | None:
    """SIGTERM, then SIGKILL if it has not exited within STOP_SECONDS; shows its output if it logged
    errors. Returns its exit code."""
    if proc.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.process.wait(), timeout=STOP_SECONDS)
        except TimeoutError:
            proc.process.kill()
            await proc.process.wait()
    await asyncio.gather(proc.drainer, return_exceptions=True)
    if any(marker in line for line in proc.tail for marker in ERROR_MARKERS):
        print(f"-- {proc.name} (pid {proc.pid}) logged errors; last lines:", file=sys.stderr)
        print("\n".join(list(proc.tail)[-40:]), file=sys.stderr)
    return proc.process.returncode
