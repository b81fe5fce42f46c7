"""Process composition: the API process (HTTP and gRPC), the worker process, and `dev` (both)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn

from app.api.grpc_server import PortUnavailable, start_grpc_server
from app.api.health import create_probe_app
from app.api.main import create_app, create_gateway_app, served
from app.api.read_slots import ReadSlots
from app.api.request_ids import RequestIds
from app.auth.caller_auth import CallerAuth, opened_caller_auth
from app.core.collector import settle_after_start_up
from app.core.config import ENV_PREFIX, Settings, SettingsError
from app.core.probes import Check, Probes
from app.delivery.egress import EgressProxy
from app.delivery.registry import ProviderRegistry, default_apps
from app.marmot.dispatch import MARMOT_CHANNELS
from app.matrix.config import gateway_address
from app.matrix.service import Gateway
from app.ops.checks import check_dependencies_at_start
from app.ops.failures import DATABASE_READ_URL, classify_replica
from app.queue.redis_streams import RedisQueue
from app.quotas.quotas import Quotas, unlimited_callers_warning
from app.runtime import Runtime, load_matrix_apps, open_gateway_alone, open_runtime
from workers.http_protocol import header_bound_protocol
from workers.listener import new_listener, run_listener
from workers.marmot_server import open_marmot
from workers.node_go_listener import new_node_go_listener, run_node_go_listener
from workers.runner import run_workers
from workers.sweeper import run_sweeper

log = logging.getLogger(__name__)
GRACE_SECONDS = 10
# A background job runs until `stop` is set, then finishes what it holds.
BackgroundJob = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]
# A worker is ready when it can take work (Redis), send it (providers) and, when one is configured,
# read fan-out pages and targets from the read replica.
WORKER_CHECKS = ("redis", "providers", "replica")


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
    caller_auth: CallerAuth | None = None


@dataclass(slots=True)
class HttpServer:
    """A running uvicorn server and its bound port."""

    server: _HttpServer
    task: asyncio.Task[None]
    port: int


@contextlib.asynccontextmanager
async def running_http(
    app: Any, settings: Settings, port: int, what: str, hosts: Sequence[str] = ()
) -> AsyncIterator[HttpServer]:
    """Serve `app` (an ASGI app) on the HTTP host (or on each of `hosts`) and `port` (0 picks a free
    one); a taken port stops start-up."""
    addresses = list(hosts) or [settings.http_host]
    sockets: list[socket.socket] = []
    try:
        for host in addresses:
            sockets.append(_bind(host, port, what, v6_only=len(addresses) > 1))
    except BaseException:
        for opened in sockets:
            opened.close()
        raise
    config = uvicorn.Config(
        RequestIds(app),
        log_config=None,
        access_log=False,
        # Nothing reads a client's address (no access log, no per-client rule), so uvicorn's
        # X-Forwarded-For middleware would only cost CPU on every request.
        proxy_headers=False,
        server_header=False,  # no "server: uvicorn": what runs here is nobody else's business
        timeout_graceful_shutdown=GRACE_SECONDS,
        http=header_bound_protocol(settings.request_timeout_seconds),
    )
    server = _HttpServer(config)
    task = asyncio.create_task(server.serve(sockets=sockets))
    try:
        await _started(server, task)
        yield HttpServer(server, task, int(sockets[0].getsockname()[1]))
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        for opened in sockets:
            opened.close()


def _bind(host: str, port: int, what: str, *, v6_only: bool = False) -> socket.socket:
    """A listening socket's address bound; `v6_only`: an IPv6 address takes no IPv4 connections (so
    that `::` and `0.0.0.0` can be bound side by side, as Sygnal's bind_addresses may list them)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError:
        raise PortUnavailable(f"{what} address {host}:{port} cannot be bound") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6_only and family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise PortUnavailable(f"{what} address {host}:{port} is in use or cannot be bound") from None
    return sock


@contextlib.asynccontextmanager
async def running_api(runtime: Runtime, *, fans_out: bool = False) -> AsyncIterator[ApiServers]:
    """Start HTTP and gRPC on the configured addresses (port 0 picks a free one); `fans_out`: the
    workers run in this process too (`dev`), so its readiness includes the read replica's."""
    settings = runtime.settings
    slots = ReadSlots()  # the request bodies both servers read at once, bounded together
    # Shared by every API process through the queue's Redis; this process's own without Redis.
    link = runtime.queue.link if isinstance(runtime.queue, RedisQueue) else None
    quotas = Quotas.from_settings(settings, link)
    # The key set is loaded before either port is bound: /healthz answers only once calls can be checked.
    async with opened_caller_auth(settings) as caller_auth:
        grpc_server, grpc_port = await start_grpc_server(
            runtime, settings.grpc_host, settings.grpc_port, slots, caller_auth=caller_auth, quotas=quotas
        )
        app = create_app(
            runtime, reads_replica=fans_out, read_slots=slots, caller_auth=caller_auth, quotas=quotas
        )
        try:
            async with running_http(served(app), settings, settings.http_port, "HTTP") as http:
                yield ApiServers(http.server, http.task, grpc_server, http.port, grpc_port, caller_auth)
        finally:
            await grpc_server.stop(GRACE_SECONDS)
            if quotas is not None:
                quotas.close()


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[tuple[Gateway, HttpServer]]:
    """The Matrix gateway alone over HTTP: its providers, memory and server, listening where the HTTP
    settings say, else where its file's `http:` section (or Sygnal's default) does."""
    config = load_matrix_apps(settings)
    if config is None:
        raise SettingsError(f"{ENV_PREFIX}MATRIX_APPS: required by `gateway`")
    address = gateway_address(settings, config.http)
    async with (
        open_gateway_alone(settings, config) as gateway,
        running_http(
            served(create_gateway_app(gateway)), settings, address.port, "HTTP", address.hosts
        ) as http,
    ):
        listening = ", ".join(host_port(host, http.port) for host in address.hosts)
        log.info("serving the Matrix push gateway on %s (%s)", listening, address.chosen_by)
        yield gateway, http


@contextlib.asynccontextmanager
async def serving_probes(runtime: Runtime, *checks: str, **own: Check) -> AsyncIterator[int]:
    """/healthz, /readyz (by the runtime's `checks` and the process's `own`) and /metrics on the
    metrics port; yields the bound port."""
    probes = runtime.probes(*checks)
    app = create_probe_app(Probes({**probes.checks, **own}, probes.sample))
    async with running_http(app, runtime.settings, runtime.settings.metrics_port, "metrics") as http:
        log.info(
            "serving metrics=%s (/healthz, /readyz, /metrics)",
            host_port(runtime.settings.http_host, http.port),
        )
        yield http.port


async def say_if_replica_unreachable(runtime: Runtime) -> None:
    """At start-up, one line naming XMTP_PUSH_DATABASE_READ_URL when the read replica does not answer.
    The process starts all the same, unready, and reads from the replica once it answers (an outage
    is ridden out, as the primary's is)."""
    if runtime.replica is None:
        return
    try:
        async with runtime.replica.connect() as connection:
            await connection.exec_driver_sql("SELECT 1")
    except Exception as error:
        failure = classify_replica(error)
        problem = (
            failure.message
            if failure
            else f"{DATABASE_READ_URL}: the read replica failed ({type(error).__name__})"
        )
        log.warning("%s; not ready until it answers", problem)


async def _started(server: _HttpServer, task: asyncio.Task[None]) -> None:
    while not server.started:
        if task.done():
            task.result()
            raise OSError("HTTP server stopped during start-up")
        await asyncio.sleep(0.01)


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
    if warning := unlimited_callers_warning(settings):
        log.warning("%s", warning)
    # On the way out the API stops first (no new work), then the background jobs finish what they hold.
    async with open_runtime(settings, in_process_queue=in_process_queue, gateway=True) as runtime:
        await check_dependencies_at_start(runtime)
        async with (
            background(runtime, jobs, stop),
            running_api(runtime, fans_out=run_workers in jobs) as servers,
        ):
            if run_workers in jobs:
                await say_if_replica_unreachable(runtime)
            await _serve_until_stopped(runtime, servers, stop)


async def _serve_until_stopped(runtime: Runtime, servers: ApiServers, stop: asyncio.Event) -> None:
    settings = runtime.settings
    # Everything made so far (modules, app, engine, servers) lives as long as
    # the process. Frozen, the collector stops rescanning it: full collections
    # over it paused the event loop for 50-140 ms at a time under load.
    settle_after_start_up(settings.gc_young_threshold)
    log.info(
        "serving http=%s grpc=%s",
        host_port(settings.http_host, servers.http_port),
        host_port(settings.grpc_host, servers.grpc_port),
    )
    jwks = servers.caller_auth.jwks if servers.caller_auth else None
    expired = jwks.expired.wait() if jwks else asyncio.Event().wait()
    await _first_of(expired, stop.wait(), servers.http_task)
    log.info("stopping")
    if jwks is not None and jwks.expired.is_set():  # the servers finish their calls on the way out
        raise jwks.expiry_error()


def host_port(host: str, port: int) -> str:
    """`host:port` as a client would dial it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_dev(settings: Settings) -> None:
    jobs: list[BackgroundJob] = [run_workers]
    if settings.xmtpd_address:
        jobs.append(run_listener)
    if settings.node_go_address:
        jobs.append(run_node_go_listener)
    if settings.marmot_configured:
        jobs.append(run_marmot)
    await serve_api(settings, jobs, in_process_queue=True)


async def serve_gateway(settings: Settings) -> None:
    """The Matrix gateway alone until SIGTERM or SIGINT: no database, queue or XMTP channel."""
    stop = _stop_on_signals()
    async with running_gateway(settings) as (_, http):
        settle_after_start_up(settings.gc_young_threshold)
        await _first_of(stop.wait(), http.task)
        log.info("stopping")


async def serve_listener(settings: Settings) -> None:
    """`listen`: the xmtpd firehose listener, the node-go listener, or both, by the addresses set."""
    stop = _stop_on_signals()
    async with open_runtime(settings, sends=False) as runtime:
        runs: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []
        # Ready means each stream is open, beside Redis (and the database the xmtpd one keeps its
        # marks in) answering.
        checks: dict[str, Check] = {}
        if settings.xmtpd_address:
            listener = new_listener(runtime)
            runs.append(listener.run)
            checks["firehose"] = listener.firehose_open
        if settings.node_go_address:
            node_go = new_node_go_listener(runtime)
            runs.append(node_go.run)
            checks["node_go"] = node_go.stream_open
        uses = ("database", "redis") if settings.xmtpd_address else ("redis",)
        async with serving_probes(runtime, *uses, **checks):
            settle_after_start_up(settings.gc_young_threshold)
            log.info("listener started")
            await run_together(runs, stop)
            log.info("listener stopped")


async def run_together(
    runs: Sequence[Callable[[asyncio.Event], Coroutine[Any, Any, None]]], stop: asyncio.Event
) -> None:
    """Run each until `stop`; one that fails stops the others, and its error is raised."""
    tasks = [asyncio.create_task(run(stop)) for run in runs]
    try:
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve_worker(settings: Settings) -> None:
    stop = _stop_on_signals()
    async with (
        open_runtime(settings) as runtime,
        serving_probes(runtime, *WORKER_CHECKS),
        background(runtime, [], stop),
    ):
        await say_if_replica_unreachable(runtime)
        settle_after_start_up(settings.gc_young_threshold)
        log.info("worker started")
        await run_workers(runtime, stop)
        log.info("worker stopped")


async def run_marmot(runtime: Runtime, stop: asyncio.Event) -> None:
    """The Marmot server as a background job of `dev`, sending through the runtime's providers."""
    async with open_marmot(runtime.settings, runtime.providers) as server:
        log.info("Marmot server: %d relay(s)", len(runtime.settings.marmot_relays))
        await server.run(stop)


async def serve_marmot(settings: Settings) -> None:
    """`xmtp-push marmot`: the relay connections, and /healthz, /readyz, /metrics on the HTTP port."""
    stop = _stop_on_signals()
    apps = [app for app in default_apps(settings) if app.channel in MARMOT_CHANNELS]
    providers = ProviderRegistry.build(
        apps, settings.provider_timeout_seconds, EgressProxy.for_providers(settings)
    )
    try:
        async with open_marmot(settings, providers) as server:
            probes = Probes(checks={"relays": server.relays_ready, "push": server.can_push})
            app = create_probe_app(probes)
            async with running_http(app, settings, settings.http_port, "HTTP") as http:
                settle_after_start_up(settings.gc_young_threshold)
                log.info(
                    "Marmot server: %d relay(s), http=%s",
                    len(settings.marmot_relays),
                    host_port(settings.http_host, http.port),
                )
                relays = asyncio.create_task(server.run(stop))
                await _first_of(_until_done(relays, http.task), stop.wait())
                log.info("stopping")
                stop.set()
                await relays
    finally:
        await providers.close()


async def _until_done(*tasks: asyncio.Task[None]) -> None:
    """Returns when any of `tasks` ends (a server that stopped on its own)."""
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)


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
