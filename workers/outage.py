"""Loops that depend on Redis and PostgreSQL ride out their outages quietly.

A failure that is an outage (the service refuses, resets, times out, lacks its database or
schema) is told to the process's DependencyLog, which names the service and its setting once per
change of state however many loops meet it; the loop backs off exponentially meanwhile. Any other
failure is a bug and is logged with its stack every time.
"""

from __future__ import annotations

import logging
import random

from app.core.dependencies import DependencyLog
from app.ops.failures import tell_or_log

FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0


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
