"""Loops that depend on Redis and PostgreSQL ride out their outages quietly.

A failure that is an outage (the service refuses, resets, times out) is logged once when the
outage starts and once when it ends, and the loop backs off exponentially in between; any other
failure is a bug and is logged with its stack every time.
"""

from __future__ import annotations

import logging
import random

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.core.database import is_unavailable

FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0


def is_outage(error: BaseException) -> bool:
    return isinstance(error, RedisConnectionError | RedisTimeoutError) or is_unavailable(error)


class Outage:
    """The state of one loop's dependencies: up, or down since some failures."""

    def __init__(self, log: logging.Logger, loop_name: str) -> None:
        self.log = log
        self.loop_name = loop_name
        self.failures = 0

    def failed(self, error: BaseException) -> float:
        """Record a failure; the seconds to wait before trying again."""
        if not is_outage(error):
            self.log.error("%s failed; continuing", self.loop_name, exc_info=error)
            return FIRST_BACKOFF_SECONDS
        if self.failures == 0:
            self.log.warning(
                "%s: Redis or the database is unavailable (%s); retrying with backoff",
                self.loop_name,
                type(error).__name__,
            )
        self.failures += 1
        ceiling = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2.0 ** (self.failures - 1))
        return ceiling * (0.5 + random.random())

    def succeeded(self) -> None:
        if self.failures:
            self.log.warning("%s: available again after %d failed tries", self.loop_name, self.failures)
            self.failures = 0
