"""The processes a pipeline run starts: the backend (`xmtp-push dev`, or `api` + `worker`s) and the receiver."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import secrets
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bench._support import die_with_parent

INGEST_TOKEN = "bench-ingest-token-" + secrets.token_hex(8)
_SERVING = re.compile(r"serving HTTP on port (\d+) and gRPC on port (\d+)")
_WORKER_READY = re.compile(r"worker started")
_RECEIVER_READY = re.compile(r"receiver listening on (\d+)")


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    tail: collections.deque[str]
    drainer: asyncio.Task[None]
    match: re.Match[str]

    @property
    def pid(self) -> int:
        return self.process.pid


def _script(name: str) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(script):
        return [script]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", "workers.cli"]


async def start_process(
    name: str, command: list[str], env: dict[str, str], ready: re.Pattern[str], stream: str = "stderr"
) -> Proc:
    process = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    tail: collections.deque[str] = collections.deque(maxlen=200)
    found: asyncio.Future[re.Match[str]] = asyncio.get_running_loop().create_future()

    async def drain() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            matched = ready.search(line)
            if matched and not found.done():
                found.set_result(matched)
        if not found.done():
            found.set_exception(RuntimeError(f"{name} exited before it was ready"))

    drainer = asyncio.create_task(drain())
    try:
        matched = await asyncio.wait_for(found, timeout=60)
    except Exception:
        print(f"{name} output tail:\n" + "\n".join(tail), file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    return Proc(name, process, tail, drainer, matched)


async def stop_process(proc: Proc) -> int | None:
    if proc.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.process.wait(), timeout=30)
        except TimeoutError:
            proc.process.kill()
            await proc.process.wait()
    await asyncio.gather(proc.drainer, return_exceptions=True)
    errors = [
        line
        for line in proc.tail
        if any(m in line for m in (" ERROR ", "Traceback", "CRITICAL", '"level": "error"', '"level":"error"'))
    ]
    if errors:
        print(f"-- {proc.name} (pid {proc.pid}) logged errors; last lines:", file=sys.stderr)
        print("\n".join(list(proc.tail)[-40:]), file=sys.stderr)
    return proc.process.returncode


def backend_env(args: argparse.Namespace, database_url: str, redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_")}
    env.update(
        {
            "XMTP_PUSH_DATABASE_URL": database_url,
            "XMTP_PUSH_INGEST_TOKEN": INGEST_TOKEN,
            "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
            "XMTP_PUSH_HTTP_PORT": "0",
            "XMTP_PUSH_GRPC_HOST": "127.0.0.1",
            "XMTP_PUSH_GRPC_PORT": "0",
            "XMTP_PUSH_HTTP_ENABLED": "true",
            "XMTP_PUSH_HTTP_ALLOW_INSECURE": "true",
            "XMTP_PUSH_HTTP_ALLOW_PRIVATE_ADDRESSES": "true",
        }
    )
    if redis_url:
        env["XMTP_PUSH_REDIS_URL"] = redis_url
    for item in args.env:
        key, _, value = item.partition("=")
        env[key if key.startswith("XMTP_PUSH_") else "XMTP_PUSH_" + key] = value
    return env


@dataclass
class Backend:
    http_port: int
    grpc_port: int
    api: Proc
    workers: list[Proc]

    @property
    def procs(self) -> list[Proc]:
        return [self.api, *self.workers]

    @property
    def worker_pids(self) -> list[int]:
        # In memory mode the one `dev` process is also the worker.
        return [w.pid for w in self.workers] or [self.api.pid]


async def _start_backend_procs(args: argparse.Namespace, env: dict[str, str], procs: list[Proc]) -> None:
    """Start the backend's processes, appending each to `procs` as soon as it runs (for the clean-up)."""
    command = _script("xmtp-push")
    if args.mode == "memory":
        procs.append(await start_process("dev", [*command, "dev"], env, _SERVING))
        return
    procs.append(await start_process("api", [*command, "api"], env, _SERVING))
    for n in range(args.workers):
        procs.append(await start_process(f"worker-{n}", [*command, "worker"], env, _WORKER_READY))


@contextlib.asynccontextmanager
async def running_backend(
    args: argparse.Namespace, database_url: str, redis_url: str | None
) -> AsyncIterator[Backend]:
    env = backend_env(args, database_url, redis_url)
    procs: list[Proc] = []
    try:
        await _start_backend_procs(args, env, procs)
        api, workers = procs[0], procs[1:]
        backend = Backend(int(api.match.group(1)), int(api.match.group(2)), api, workers)
        described = ", ".join(f"{p.name} pid {p.pid}" for p in procs)
        print(f"backend: {args.mode} mode: {described}; HTTP {backend.http_port}, gRPC {backend.grpc_port}")
        yield backend
    finally:
        for proc in reversed(procs):
            code = await stop_process(proc)
            if code not in (0, None):
                print(f"backend: {proc.name} exited with {code}", file=sys.stderr)


@contextlib.asynccontextmanager
async def running_receiver(args: argparse.Namespace) -> AsyncIterator[tuple[Proc, int]]:
    command = [
        sys.executable,
        "-m",
        "bench.receiver",
        "--port",
        str(args.receiver_port),
        "--sample-every",
        str(args.sample_every),
    ]
    proc = await start_process("receiver", command, dict(os.environ), _RECEIVER_READY)
    port = int(proc.match.group(1))
    print(f"receiver: pid {proc.pid}, http://127.0.0.1:{port}/hook (raw asyncio + httptools + uvloop)")
    try:
        yield proc, port
    finally:
        await stop_process(proc)
