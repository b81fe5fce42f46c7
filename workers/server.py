"""Process composition: the API process (HTTP and gRPC), the worker process, and `dev` (both)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn

from app.api.grpc_server import start_grpc_server
from app.api.main import create_app
from app.core.collector import settle_after_start_up
from app.core.config import Settings
from app.runtime import Runtime, open_runtime
from workers.http_protocol import header_bound_protocol
from workers.listener import run_listener
from workers.runner import run_workers
from workers.sweeper import run_sweeper

log = logging.getLogger(__name__)
GRACE_SECONDS = 10
# A background job runs until `stop` is set, then finishes what it holds.
BackgroundJob = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


class _HttpServer(uvicorn.Server):
    # Signals are handled by this module so the process exits 0; uvicorn's own
    # capture would re-raise them after shutdown.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(slots=True)
class ApiServers:
    """The running HTTP and gRPC servers of one runtime, with their bound ports."""

    http: _HttpServer
    http_task: asyncio.Task[None]
    grpc: grpc.aio.Server
    http_port: int
    grpc_port: int


@contextlib.asynccontextmanager
async def running_api(runtime: Runtime) -> AsyncIterator[ApiServers]:
    """Start HTTP and gRPC on the configured addresses (port 0 picks a free one)."""
    settings = runtime.settings
    grpc_server, grpc_port = await start_grpc_server(runtime, settings.grpc_host, settings.grpc_port)
    config = uvicorn.Config(
        create_app(runtime),
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
        http=header_bound_protocol(settings.request_timeout_seconds),
    )
    http_server = _HttpServer(config)
    http_task = asyncio.create_task(http_server.serve())
    try:
        http_port = await _bound_http_port(http_server, http_task)
        yield ApiServers(http_server, http_task, grpc_server, http_port, grpc_port)
    finally:
        http_server.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
        await grpc_server.stop(GRACE_SECONDS)


async def _bound_http_port(server: _HttpServer, task: asyncio.Task[None]) -> int:
    while not server.started:
        if task.done():
            task.result()
            raise OSError("HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return int(server.servers[0].sockets[0].getsockname()[1])


@contextlib.asynccontextmanager
async def background(
    runtime: Runtime, jobs: Sequence[BackgroundJob], stop: asyncio.Event
) -> AsyncIterator[None]:
    """Run jobs (and the expiry sweep) beside the body; on exit, stop them and wait."""
    tasks = [asyncio.create_task(job(runtime, stop)) for job in (run_sweeper, *jobs)]
    try:
        yield
    finally:
        stop.set()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("a background job failed: %s", type(result).__name__)


async def serve_api(
    settings: Settings, jobs: Sequence[BackgroundJob] = (), *, in_process_queue: bool = False
) -> None:
    """Serve HTTP and gRPC until SIGTERM or SIGINT, with the sweeper and any background jobs."""
    stop = _stop_on_signals()
    # On the way out the API stops first (no new work), then the background jobs finish what they hold.
    async with (
        open_runtime(settings, in_process_queue=in_process_queue) as runtime,
        background(runtime, jobs, stop),
        running_api(runtime) as servers,
    ):
        # Everything made so far (modules, app, engine, servers) lives as long as
        # the process. Frozen, the collector stops rescanning it: full collections
        # over it paused the event loop for 50-140 ms at a time under load.
        settle_after_start_up(settings.gc_young_threshold)
        log.info("serving HTTP on port %d and gRPC on port %d", servers.http_port, servers.grpc_port)
        await _first_of(stop.wait(), servers.http_task)
        log.info("stopping")


async def serve_dev(settings: Settings) -> None:
    jobs: list[BackgroundJob] = [run_workers]
    if settings.xmtpd_address:
        jobs.append(run_listener)
    await serve_api(settings, jobs, in_process_queue=True)


async def serve_listener(settings: Settings) -> None:
    stop = _stop_on_signals()
    async with open_runtime(settings, sends=False) as runtime:
        settle_after_start_up(settings.gc_young_threshold)
        log.info("listener started")
        await run_listener(runtime, stop)
        log.info("listener stopped")


async def serve_worker(settings: Settings) -> None:
    stop = _stop_on_signals()
    async with open_runtime(settings) as runtime, background(runtime, [], stop):
        settle_after_start_up(settings.gc_young_threshold)
        log.info("worker started")
        await run_workers(runtime, stop)
        log.info("worker stopped")


async def _first_of(*awaitables: Awaitable[object]) -> None:
    waiters = [asyncio.ensure_future(a) for a in awaitables]
    _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in pending:
        if waiter is not waiters[-1]:
            waiter.cancel()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
