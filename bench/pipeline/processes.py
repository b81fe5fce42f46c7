"""The processes a pipeline run starts: the backend (`xmtp-push dev`, or `api` + `worker`s) and the receiver."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bench._processes import SERVING, Proc, server_env, start_process, stop_process, xmtp_push_command

INGEST_TOKEN = "bench-ingest-token-" + secrets.token_hex(8)
_WORKER_READY = re.compile(r"worker started")
_RECEIVER_READY = re.compile(r"receiver listening on (\d+)")


def backend_env(args: argparse.Namespace, database_url: str, redis_url: str | None) -> dict[str, str]:
    env = server_env(database_url)
    env["XMTP_PUSH_INGEST_TOKEN"] = INGEST_TOKEN
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
    command = xmtp_push_command()
    if args.mode == "memory":
        procs.append(await start_process("dev", [*command, "dev"], env, SERVING))
        return
    procs.append(await start_process("api", [*command, "api"], env, SERVING))
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
