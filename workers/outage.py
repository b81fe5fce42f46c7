"""Loops that depend on Redis and PostgreSQL ride out their outages quietly.

A failure that is an outage (the service refuses, resets, times out, lacks its database or
schema) is told to the process's DependencyLog, which names the service and its setting once per
change of state however many loops meet it; the loop backs off exponentially meanwhile. Any other
failure is a bug and is logged with its stack every time.

A listener's network node is told likewise (`Reachability`: its failing once, its answering once), and
its stream is opened again and again with capped backoff (`keep_connected`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from prometheus_client import Counter

from app.core.dependencies import DependencyLog
from app.ops.failures import tell_or_log

FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0
# A listener's reconnects to a network node.
BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS = 0.5, 30.0


class Outage:
    """The state of one loop's dependencies: up, or down since some failures."""

    def __init__(self, log: logging.Logger, loop_name: str, dependencies: DependencyLog) -> None:
        self.log = log
        self.loop_name = loop_name
        self.dependencies = dependencies
        self.failures = 0
        self.down: str | None = None  # the service this loop last failed on

    def failed(self, error: BaseException) -> float:
        """Record a failure; the seconds to wait before trying again."""
        retries, bug = f"{self.loop_name} retries with backoff", f"{self.loop_name} failed; continuing"
        failure = tell_or_log(error, self.dependencies, retries, self.log, bug)
        if failure is None:
            return FIRST_BACKOFF_SECONDS
        self.down = failure.service
        self.failures += 1
        ceiling = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2.0 ** (self.failures - 1))
        return ceiling * (0.5 + random.random())

    def succeeded(self) -> None:
        if self.failures:
            self.log.debug("%s: going on after %d failed tries", self.loop_name, self.failures)
            if self.down is not None:
                self.dependencies.up(self.down)
            self.failures = 0
            self.down = None


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less when `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Reachability:
    """Whether a network node opened the stream a listener asked for: its failing said once until it
    answers, then its answering once, each with the setting to look at (never the address)."""

    def __init__(self, log: logging.Logger, setting: str, node: str, stream: str) -> None:
        self.log, self.setting, self.node, self.stream = log, setting, node, stream
        self.unreachable = False

    def failed(self, code: grpc.StatusCode) -> None:
        if not self.unreachable:
            self.unreachable = True
            what = "is unreachable" if code is grpc.StatusCode.UNAVAILABLE else f"refused {self.stream}"
            self.log.warning(
                "%s: %s %s (%s); retrying with backoff", self.setting, self.node, what, code.name
            )

    def answered(self) -> None:
        if self.unreachable:
            self.unreachable = False
            self.log.warning("%s: %s answers again", self.setting, self.node)


def node_channel(address: str, *, tls: bool, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """A channel to a network node: TLS with the system's roots, or plain."""
    if tls:
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(), options=options)
    return grpc.aio.insecure_channel(address, options=options)


async def keep_connected(
    stop: asyncio.Event, connect_once: Callable[[asyncio.Event], Awaitable[bool]], reconnects: Counter
) -> None:
    """Run `connect_once` (True: its stream was open before it ended) again and again until `stop`,
    pausing with capped backoff between tries, counted in `reconnects`."""
    failures = 0
    while not stop.is_set():
        healthy = await connect_once(stop)
        if stop.is_set():
            break
        failures = 0 if healthy else failures + 1
        reconnects.inc()
        await pause(stop, backoff(failures))


def backoff(failures: int) -> float:
    """Capped exponential with full jitter; a short pause even after a healthy stream ended."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0**failures)
    return random.uniform(ceiling / 2, ceiling)
