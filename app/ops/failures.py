"""Expected operational failures of a command: one line naming the setting, and an exit code each.

A command that meets one of these prints `xmtp-push: <SETTING>: <what is wrong>` and exits with its
code (docs/configuration.md, "Exit codes", lists them); anything else is a bug and keeps its traceback.
The line never holds the setting's value: a database or Redis URL may carry a password.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import redis.exceptions
from sqlalchemy import exc as sa_exc

from app.core.config import ENV_PREFIX
from app.core.database import SqliteFolderMissing, is_unavailable
from app.core.dependencies import DependencyLog
from app.core.migrations import MigrationsNotFound
from app.queue.base import PartitionCountMismatch

CHECK_FAILED = 1  # `config check` found a problem it has no code for; `send-test` was not delivered
INVALID_CONFIGURATION = 2  # a setting's value (a malformed URL included), or a usage error
PORT_TAKEN = 3
DATABASE_UNREACHABLE = 4
DATABASE_MISSING = 5
DATABASE_CREDENTIALS_REFUSED = 6
DATABASE_NOT_MIGRATED = 7
REDIS_UNREACHABLE = 8
MIGRATIONS_MISSING = 9
DATABASE_DISK_FULL = 11
AUTH_KEYS_UNAVAILABLE = 10  # the contract's code for a JWKS without a usable key (docs/callers.md#key-set)

DATABASE_URL = f"{ENV_PREFIX}DATABASE_URL"
DATABASE_READ_URL = f"{ENV_PREFIX}DATABASE_READ_URL"
REDIS_URL = f"{ENV_PREFIX}REDIS_URL"
# PostgreSQL SQLSTATEs: no such database; no such role or a wrong password; no such table; and
# a database not accepting connections.
_MISSING_DATABASE = "3D000"
_CREDENTIALS = "28"
_NO_TABLE = "42P01"
_NOT_ACCEPTING = "55000"  # ALLOW_CONNECTIONS false (a failover, maintenance)
_DISK_FULL = "53100"
SQLITE_FULL = "database or disk is full"  # SQLite's words for SQLITE_FULL


@dataclass(frozen=True, slots=True)
class Failure:
    code: int
    message: str  # names the setting, never its value

    def line(self) -> str:
        return f"xmtp-push: {self.message}"

    @property
    def service(self) -> str:
        """The service that fails: `redis` or `database`."""
        return "redis" if self.code == REDIS_UNREACHABLE else "database"

    def tell(self, dependencies: DependencyLog, consequence: str) -> None:
        """Report this outage to the process's log of its dependencies (one line per change)."""
        dependencies.down(self.service, self.code, self.message, consequence)


# Redis cannot serve: refused, timed out, or a cluster failing over (a primary lost and its slots
# not served until its replica takes over).
REDIS_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)
CLUSTER_PROBLEMS = {
    redis.exceptions.ClusterDownError: (
        "the Redis Cluster answers CLUSTERDOWN (a slot has no primary serving it: a failover under way,"
        " or a node holding a slot open)"
    ),
    redis.exceptions.TryAgainError: "the Redis Cluster answers TRYAGAIN (a slot is being moved)",
    redis.exceptions.SlotNotCoveredError: "the Redis Cluster leaves a slot without a node",
}


def classify(error: BaseException) -> Failure | None:
    """The expected failure `error` stands for, or None for a bug."""
    chain = list(_chain(error))
    for link in chain:
        if isinstance(link, MigrationsNotFound):
            return Failure(MIGRATIONS_MISSING, str(link))
        if isinstance(link, PartitionCountMismatch):  # its message names the setting
            return Failure(INVALID_CONFIGURATION, str(link))
        if isinstance(link, SqliteFolderMissing):
            return _database(DATABASE_MISSING, "the SQLite file cannot be opened: its folder does not exist")
        if isinstance(link, REDIS_DOWN):
            return Failure(REDIS_UNREACHABLE, f"{REDIS_URL}: {_redis_problem(link, chain)}")
    for link in chain:
        if isinstance(link, sa_exc.DBAPIError):
            return _database_failure(link, chain)
    if any(isinstance(link, OSError | TimeoutError) for link in chain):
        return _database(DATABASE_UNREACHABLE, f"the database is unreachable ({_reason(chain)})")
    return None


# The failures a running command rides out: the database or Redis cannot serve (yet).
OUTAGES = frozenset(
    {
        DATABASE_UNREACHABLE,
        DATABASE_MISSING,
        DATABASE_CREDENTIALS_REFUSED,
        DATABASE_NOT_MIGRATED,
        DATABASE_DISK_FULL,
        REDIS_UNREACHABLE,
    }
)


def outage(error: BaseException) -> Failure | None:
    """The outage `error` stands for (which service, and what is wrong with it), or None for a bug."""
    failure = classify(error)
    if failure is not None and failure.code in OUTAGES:
        return failure
    if is_unavailable(error):  # a pool timeout, a connection invalidated mid-call
        return _database(DATABASE_UNREACHABLE, f"the database is unavailable ({type(error).__name__})")
    return None


def tell_or_log(
    error: BaseException, dependencies: DependencyLog, consequence: str, log: logging.Logger, bug: str
) -> Failure | None:
    """An outage goes to the process's log of its dependencies (one line per change of state, naming
    the setting); anything else is a bug, logged as `bug` with its stack every time. The outage, or
    None for a bug."""
    failure = outage(error)
    if failure is None:
        log.error(bug, exc_info=error)
    else:
        failure.tell(dependencies, consequence)
    return failure


def _database_failure(error: sa_exc.DBAPIError, chain: list[BaseException]) -> Failure | None:
    state = getattr(error.orig, "sqlstate", None) or ""
    sqlite_message = str(error.orig) if isinstance(error.orig, sqlite3.Error) else ""
    if state == _MISSING_DATABASE:
        return _database(DATABASE_MISSING, "the database does not exist: create it, then `xmtp-push migrate`")
    if sqlite_message.startswith("unable to open database file"):
        return _database(DATABASE_MISSING, "the SQLite file cannot be opened (does its folder exist?)")
    if state.startswith(_CREDENTIALS):
        return _database(DATABASE_CREDENTIALS_REFUSED, "the database refused the user or its password")
    if state == _NO_TABLE or sqlite_message.startswith("no such table"):
        return _database(DATABASE_NOT_MIGRATED, "the database has no schema: run `xmtp-push migrate`")
    if state == _DISK_FULL or sqlite_message.startswith(SQLITE_FULL):
        return _database(DATABASE_DISK_FULL, "the database's disk is full")
    if state == _NOT_ACCEPTING:
        return _database(DATABASE_UNREACHABLE, "the database does not accept connections now")
    if is_unavailable(error):
        return _database(DATABASE_UNREACHABLE, f"the database is unreachable ({_reason(chain)})")
    return None


def _database(code: int, problem: str) -> Failure:
    return Failure(code, f"{DATABASE_URL}: {problem}")


# What a replica's missing database or schema means: it does not replicate DATABASE_URL's.
_NOT_A_REPLICA = {
    DATABASE_MISSING: f"the read replica has no such database: is it a replica of {DATABASE_URL}?",
    DATABASE_NOT_MIGRATED: f"the read replica has no schema: is it a replica of {DATABASE_URL}?",
}


def classify_replica(error: BaseException) -> Failure | None:
    """As `classify`, for an error met on the read replica: the line names XMTP_PUSH_DATABASE_READ_URL."""
    failure = classify(error)
    if failure is None or not failure.message.startswith(f"{DATABASE_URL}: "):
        return failure
    problem = failure.message.removeprefix(f"{DATABASE_URL}: ").replace("the database", "the read replica")
    return Failure(failure.code, f"{DATABASE_READ_URL}: {_NOT_A_REPLICA.get(failure.code, problem)}")


SOURCE_OPTION = "--from"
_NOT_THE_SOURCE = {DATABASE_NOT_MIGRATED: "the database lacks a table the import reads"}


def classify_source(error: BaseException) -> Failure | None:
    """As `classify`, for an error met on the database `legacy import --from` reads: the line names
    --from (never its URL, which may hold a password)."""
    failure = classify(error)
    if failure is None or not failure.message.startswith(f"{DATABASE_URL}: "):
        return failure
    problem = failure.message.removeprefix(f"{DATABASE_URL}: ").split(": create it")[0]
    return Failure(failure.code, f"{SOURCE_OPTION}: {_NOT_THE_SOURCE.get(failure.code, problem)}")


def _chain(error: BaseException) -> Iterator[BaseException]:
    current: BaseException | None = error
    for _ in range(16):
        if current is None:
            return
        yield current
        current = current.__cause__ or current.__context__


def _redis_problem(error: BaseException, chain: list[BaseException]) -> str:
    """A cluster that answers but cannot serve a slot is told as such: its nodes are reachable, and
    what the operator looks at is the cluster's state, not the network."""
    for kind, problem in CLUSTER_PROBLEMS.items():
        if isinstance(error, kind):
            return problem
    return f"Redis is unreachable ({_reason(chain)})"


def _reason(chain: list[BaseException]) -> str:
    """What the connection met, in words that hold no host, port or URL."""
    for link in chain:
        if isinstance(link, socket.gaierror):
            return "its host name does not resolve"
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, TimeoutError | redis.exceptions.TimeoutError):
            return "no answer in time"
        if isinstance(link, redis.exceptions.AuthenticationError):
            return "credentials refused"
    return type(chain[-1]).__name__
