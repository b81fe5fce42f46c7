"""What a process last saw of the services it depends on (the database, Redis).

The calls and loops that meet an outage report it here, and the operator reads one line when a
service stops serving or starts failing in another way, and one when it serves again: not a line
per call, nor one per loop of the process. A line names the setting, never its value.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
# What each service is configured by and called, in the line saying it serves again.
SETTINGS = {"database": "XMTP_PUSH_DATABASE_URL", "redis": "XMTP_PUSH_REDIS_URL"}
NAMES = {"database": "the database", "redis": "Redis"}


class DependencyLog:
    """The state each service is down in, if any; one per process (the runtime's)."""

    def __init__(self) -> None:
        self._states: dict[str, int] = {}

    def down(self, service: str, state: int, problem: str, consequence: str) -> None:
        """`service` is in `state` (unreachable, missing, ...: the failure's exit code), said by
        `problem` (a line naming its setting); logged when that state is news."""
        if self._states.get(service) == state:
            return
        self._states[service] = state
        log.warning("%s; %s", problem, consequence)

    def up(self, service: str) -> None:
        """`service` served a request: logged when it was down."""
        if self._states.pop(service, None) is not None:
            log.warning("%s: %s answers again", SETTINGS[service], NAMES[service])

    def is_down(self, service: str) -> bool:
        return service in self._states
