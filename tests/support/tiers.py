"""Test tiers: each test is marked with the outside services it needs (markers registered in
pyproject.toml), and `slow` when it takes a second or more, so `make test-fast` can run, within a
minute, the tests that need no outside service and are not slow.

Markers are written where the tests are: `pytestmark = pytest.mark.slow` for a module,
`@pytest.mark.slow`, `@pytest.mark.postgres`, `@pytest.mark.tools("nginx")` ... for a test that waits out a
timeout or reaches a service or a program itself. Fixtures mark the tests that request them (FIXTURES),
and the fixtures that run a test on several stands mark each item by its stand (PARAMETERS: the SQLite
variant needs nothing, the PostgreSQL one PostgreSQL). Before a marked test runs, each of its services is
looked for; one that is absent fails the test with one line naming it and how to start it: a test never
skips. With `--fast-tier-seconds` (`make test-fast` passes it), a test of the fast tier whose call takes
longer fails with its name, so a slow test cannot lengthen the fast tier unseen.

This module is a pytest plugin (tests/conftest.py registers it).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import POSTGRES_ADMIN_DSN
from tests.support.pipeline import REDIS_TEST_URL
from tests.support.redis_cluster import CLUSTER_ENV
from tests.support.redis_cluster import HOW_TO_START as HOW_TO_START_THE_CLUSTER
from tests.support.replica import REPLICA_ADMIN_DSN
from tests.support.synapse import synapse_venvs

# --- how a test is found to need a service -------------------------------------------------------

# Fixtures that reach a service, wherever they are defined.
FIXTURES: dict[str, tuple[str, ...]] = {
    "postgresql_url": ("postgres",),
    "postgres_api": ("postgres",),  # test_database_outage.py
    "empty_postgres": ("postgres",),  # test_cli_messages.py
    "empty_database": ("postgres",),  # test_runtime_trouble.py
    "go_database": ("postgres",),  # test_legacy_import.py: the Go server's tables
    "fresh_postgres": ("postgres",),  # test_legacy_import.py
    "primary_url": ("postgres", "pg_replica"),  # test_read_replica.py
    "redis_url": ("redis",),
    "redis_client": ("redis",),
    "redis_database": ("redis",),  # test_queue_contract.py
    "redis_cluster": ("redis_cluster",),
    "redis_postgresql_stack": ("redis", "postgres"),
    "cluster_postgresql_stack": ("redis_cluster", "postgres"),
    "synapse": ("synapse",),
}


def _stand(value: object) -> tuple[str, ...]:
    """The services of a stand named `queue-database`, `database` or `queue` (memory, sqlite: none)."""
    parts = str(value).split("-")
    return tuple(
        {"postgresql": "postgres", "redis": "redis", "cluster": "redis_cluster"}[part]
        for part in parts
        if part in ("postgresql", "redis", "cluster")
    )


# Fixtures run once per stand (params=...): the services of the stand a test item runs on.
PARAMETERS: dict[str, Callable[[object], tuple[str, ...]]] = {
    "database_url": _stand,  # sqlite | postgresql (conftest.py)
    "our_database": _stand,  # sqlite | postgresql (test_legacy_import.py)
    "stack": _stand,  # memory-sqlite ... cluster-postgresql (tests/support/pipeline.py)
    "some_stack": _stand,
    "redis_stack": _stand,
    "shared_redis_url": _stand,  # redis | cluster (tests/support/marmot.py)
    "make_queue": _stand,  # memory | redis | cluster (test_queue_contract.py)
    "redis_server": _stand,  # redis | cluster (test_queue_contract.py)
}


def needs_of(item: pytest.Item) -> set[str]:
    """The services a test item needs through its fixtures and the stands they run it on."""
    services: set[str] = set()
    for name in getattr(item, "fixturenames", ()):
        services.update(FIXTURES.get(name, ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, value in params.items():
        if name in PARAMETERS:
            services.update(PARAMETERS[name](value))
    return services


def mark(items: Iterable[pytest.Item]) -> None:
    for item in items:
        for service in sorted(needs_of(item)):
            item.add_marker(getattr(pytest.mark, service))


# --- the fast tier stays fast: a test over its bound fails, named ----------------------------------


@functools.cache
def tier_markers(inipath: Path) -> frozenset[str]:
    """The markers pyproject.toml registers (not the plugins' own, such as asyncio): each takes a test
    out of the fast tier."""
    lines = tomllib.loads(inipath.read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]["markers"]
    return frozenset(re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in lines)


def in_fast_tier(item: pytest.Item) -> bool:
    assert item.config.inipath is not None  # pyproject.toml
    return not any(item.get_closest_marker(name) for name in tier_markers(item.config.inipath))


def fast_tier_bound(seconds: float) -> float:
    """`seconds` on an idle machine. A busy one stretches every test, so the bound stretches with its
    load per core; what it catches, a test that waits out a timeout, takes as long on any machine."""
    return seconds * (1 + os.getloadavg()[0] / (os.cpu_count() or 1))


def hold_to_the_fast_tier(item: pytest.Item, report: pytest.TestReport) -> None:
    seconds = item.config.getoption("fast_tier_seconds")
    if seconds is None or report.when != "call" or not report.passed or not in_fast_tier(item):
        return
    bound = fast_tier_bound(seconds)
    if report.duration > bound:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {report.duration:.2f} s, over the fast tier's {bound:.2f} s "
            f"({seconds:g} s at this machine's load): mark it @pytest.mark.slow, or make it faster"
        )


# --- a service that is absent: one line ------------------------------------------------------------


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def _where(url: str, default_port: int) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or default_port}"


def _postgres() -> str | None:
    if _answers(POSTGRES_ADMIN_DSN, 5432):
        return None
    return (
        f"PostgreSQL does not answer at {_where(POSTGRES_ADMIN_DSN, 5432)} (XMTP_PUSH_TEST_POSTGRES): "
        "`.ci/run` installs and starts it (with Redis) before `make install check`"
    )


def _replica() -> str | None:
    if _answers(REPLICA_ADMIN_DSN, 5432):
        return None
    return (
        f"no PostgreSQL streaming replica answers at {_where(REPLICA_ADMIN_DSN, 5432)} "
        "(XMTP_PUSH_TEST_POSTGRES_REPLICA): `make pg-replica` starts one"
    )


def _redis() -> str | None:
    if _answers(REDIS_TEST_URL, 6379):
        return None
    return (
        f"Redis does not answer at {_where(REDIS_TEST_URL, 6379)} (XMTP_PUSH_TEST_REDIS): "
        "`.ci/run` installs and starts it (with PostgreSQL) before `make install check`"
    )


def _cluster() -> str | None:
    url = os.environ.get(CLUSTER_ENV)
    if url and _answers(url, 6379):
        return None
    return HOW_TO_START_THE_CLUSTER + (f" (nothing answers at {_where(url, 6379)})" if url else "")


def _synapse() -> str | None:
    venvs = synapse_venvs()
    if any((venv / "bin" / "python").exists() for venv in venvs):
        return None
    return f"Synapse is not installed (looked in {', '.join(map(str, venvs))}): `make synapse` creates it"


PACKAGES = {
    "chromium": "chromium",
    "docker-compose": "docker-compose",
    "nginx": "nginx-light",
    "node": "nodejs",
    "npm": "npm",
    "promtool": "prometheus",
    "redis-server": "redis-server",
}


def _tool(name: str) -> str | None:
    if shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])):
        return None
    return (
        f"`{name}` is not installed: `apt-get install -y {PACKAGES[name]}` (.ci/run installs it when missing)"
    )


PROBES: dict[str, Callable[[], str | None]] = {
    "postgres": _postgres,
    "pg_replica": _replica,
    "redis": _redis,
    "redis_cluster": _cluster,
    "synapse": _synapse,
    "browser": lambda: _tool("chromium"),
}
_absent: dict[str, str | None] = {}


def check(item: pytest.Item) -> None:
    """Fail the item in one line when a service or program it is marked with is absent."""
    probes: list[tuple[str, Callable[[], str | None]]] = []
    for name, probe in PROBES.items():  # PostgreSQL before its replica
        if item.get_closest_marker(name) is not None:
            probes.append((name, probe))
    for marker in item.iter_markers("tools"):
        probes.extend((name, lambda name=name: _tool(name)) for name in marker.args)
    for key, probe in probes:
        if key not in _absent:
            _absent[key] = probe()
        if _absent[key] is not None:
            pytest.fail(str(_absent[key]), pytrace=False)


# --- the hooks -------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast-tier-seconds",
        type=float,
        default=None,
        help="fail a test of the fast tier (no marker of pyproject.toml) whose call takes longer (make test-fast)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the outside services its fixtures need."""
    mark(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A service a test needs that is absent fails it in one line, before its fixtures run."""
    check(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    hold_to_the_fast_tier(item, outcome.get_result())
