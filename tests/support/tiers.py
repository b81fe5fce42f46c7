"""Test tiers: each test is marked with the outside services it needs (markers registered in
pyproject.toml), and `slow` when it takes a second or more, so `make test-fast` can run, within a
minute, the tests that need no outside service and are not slow.

A test is marked from the fixtures it requests (FIXTURES), from the parameters of the fixtures that run
it on several stands (PARAMETERS: the SQLite variant needs nothing, the PostgreSQL one PostgreSQL), and,
for a test that reaches a service or a program itself, from the table in TESTS. Before a marked test
runs, each of its services is looked for; one that is absent fails the test with one line naming it and
how to start it: a test never skips.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
    "stack": _stand,  # memory-sqlite ... cluster-postgresql (tests/support/pipeline.py)
    "some_stack": _stand,
    "redis_stack": _stand,
    "shared_redis_url": _stand,  # redis | cluster (tests/support/marmot.py)
    "make_queue": _stand,  # memory | redis | cluster (test_queue_contract.py)
    "redis_server": _stand,  # redis | cluster (test_queue_contract.py)
}


@dataclass(frozen=True)
class Needs:
    """A test (`module::function`) that reaches services itself; with `only`, just the items whose
    parameter has one of the values given."""

    test: str
    services: tuple[str, ...]
    tools: tuple[str, ...] = ()
    only: tuple[str, tuple[str, ...]] | None = None


COMPOSE = ("tools",)
TESTS: tuple[Needs, ...] = (
    Needs(
        "test_cli_messages.py::test_a_database_failure_is_one_line_with_its_code",
        ("postgres",),
        only=("case", ("missing", "credentials")),
    ),
    Needs("test_cli_messages.py::test_config_check_exits_with_the_first_failures_code", ("postgres",)),
    Needs("test_cli_messages.py::test_debugging_shows_the_traceback_too", ("postgres",)),
    Needs("test_database_reads.py::test_a_read_after_a_lost_connection_reconnects_first", ("postgres",)),
    Needs("test_log_redaction.py::test_dev_logs_json_lines_without_secrets", ("postgres",)),
    Needs("test_deploy.py::test_the_migrate_job_migrates_on_a_read_only_root", ("postgres",)),
    Needs("test_channels_e2e.py", ("redis", "postgres")),
    Needs(
        "test_runtime_trouble.py::test_a_worker_says_once_that_redis_is_down_and_once_that_it_is_back",
        ("tools",),
        tools=("redis-server",),
    ),
    Needs(
        "test_runtime_trouble.py::test_listen_is_not_ready_until_the_firehose_is_open_and_names_the_node_setting",
        ("redis",),
    ),
    Needs(
        "test_operations.py::test_compose_file_is_valid_and_has_the_production_shape",
        COMPOSE,
        tools=("docker-compose",),
    ),
    Needs(
        "test_operations.py::test_compose_file_passes_every_setting_of_the_env_file",
        COMPOSE,
        tools=("docker-compose",),
    ),
    Needs(
        "test_operations.py::test_compose_file_refuses_to_start_without_a_database_password",
        COMPOSE,
        tools=("docker-compose",),
    ),
    Needs("test_operations.py::test_nginx_example_routes_grpc_and_connect", ("tools",), tools=("nginx",)),
    Needs("test_operations.py::test_stats_after_a_scripted_run", ("redis",)),
    Needs("test_operations.py::test_config_check", ("redis",)),
    Needs(
        "test_monitoring.py::test_promtool_checks_and_tests_the_alert_rules", ("tools",), tools=("promtool",)
    ),
    Needs(
        "test_monitoring.py::test_prometheus_scrapes_every_process_of_the_compose_file",
        ("tools",),
        tools=("promtool",),
    ),
    Needs(
        "test_monitoring.py::test_the_monitoring_profile_mounts_the_deploy_files",
        COMPOSE,
        tools=("docker-compose",),
    ),
    Needs(
        "test_monitoring.py::test_the_workers_and_the_listener_are_checked_on_their_metrics_port",
        COMPOSE,
        tools=("docker-compose",),
    ),
    Needs("test_status_page.py::test_status_page_in_headless_chromium", ("browser",)),
    Needs("test_status_page.py::test_a_failure_burst_shows_in_red", ("browser",)),
)


# --- slow: left out of `make test-fast` too, which stays within a minute ------------------------------

# Modules whose tests run the product end to end: xmtp-push processes, the whole pipeline, a burst.
SLOW_MODULES = frozenset(
    {
        "test_cli.py",
        "test_cli_messages.py",
        "test_delivery_slots.py",
        "test_egress_proxy.py",
        "test_first_hint.py",
        "test_first_hour.py",
        "test_listener.py",
        "test_marmot_burst.py",
        "test_marmot_command.py",
        "test_matrix_isolation.py",
        "test_packaging.py",
        "test_pipeline_e2e.py",
        "test_queue_outage.py",
        "test_runtime_trouble.py",
    }
)
# Tests elsewhere that wait out a timeout, a retry or a watchdog: a second or more each.
SLOW_TESTS = frozenset(
    {
        "test_admission.py::test_client_deadlines_shorter_than_the_limit_are_honoured",
        "test_admission.py::test_deadline_exceeded_when_blocked",
        "test_apns.py::test_a_connection_is_kept_while_used_and_closed_once_idle",
        "test_apns.py::test_an_answer_after_the_timeout_harms_no_other_request",
        "test_apns.py::test_connection_refused_is_transient",
        "test_apns.py::test_padded_error_answers_on_one_connection_all_resolve",
        "test_apns.py::test_untrusted_server_certificate_is_transient",
        "test_database_outage.py::test_a_database_that_accepts_and_never_answers_is_unavailable_within_the_connect_timeout",
        "test_fcm.py::test_a_401_while_the_token_endpoint_stalls_freezes_no_channel",
        "test_fcm.py::test_a_401_whose_fresh_token_does_not_come_in_time_is_transient",
        "test_fcm.py::test_a_slow_token_endpoint_does_not_stall_the_event_loop",
        "test_marmot_relays.py::test_a_relay_restarted_mid_run_is_reconnected_and_later_wraps_arrive",
        "test_marmot_relays.py::test_a_silent_relay_is_reconnected_after_the_watchdog",
        "test_marmot_shared.py::test_with_redis_away_a_server_pushes_alone_and_logs_it_once",
        "test_marmot_triggers.py::test_at_most_max_concurrent_triggers_are_in_flight",
        "test_marmot_triggers.py::test_pushes_in_flight_are_bounded_per_channel",
        "test_matrix_answers.py::test_a_body_that_trickles_is_answered_408_at_the_request_timeout",
        "test_matrix_config.py::test_a_token_app_is_refused_where_a_certificate_is_required",
        "test_matrix_gateway.py::test_an_fcm_quota_retry_after_within_the_budget_is_waited_for",
        "test_matrix_gateway.py::test_an_fcm_retry_after_within_the_budget_is_waited_for",
        "test_matrix_gateway.py::test_fcm_quota_answers_are_tried_three_times_in_all",
        "test_matrix_gateway.py::test_retries_stop_at_the_request_timeout_with_502",
        "test_queue_contract.py::test_claim_expires_after_its_ttl",
        "test_request_bounds.py::test_a_body_that_trickles_is_given_up_at_the_request_timeout",
        "test_request_bounds.py::test_headers_that_trickle_are_cut_off_at_the_request_timeout",
    }
)


def _module_and_name(item: pytest.Item) -> tuple[str, str]:
    module = Path(str(item.fspath)).name
    return module, f"{module}::{getattr(item, 'originalname', item.name)}"


def needs_of(item: pytest.Item) -> tuple[set[str], set[str]]:
    """The services and the programs a test item needs."""
    services: set[str] = set()
    tools: set[str] = set()
    for name in getattr(item, "fixturenames", ()):
        services.update(FIXTURES.get(name, ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, value in params.items():
        if name in PARAMETERS:
            services.update(PARAMETERS[name](value))
    module, test = _module_and_name(item)
    for needs in TESTS:
        if needs.test not in (module, test):
            continue
        if needs.only is not None and params.get(needs.only[0]) not in needs.only[1]:
            continue
        services.update(needs.services)
        tools.update(needs.tools)
    return services, tools


def mark(items: Iterable[pytest.Item]) -> None:
    for item in items:
        services, tools = needs_of(item)
        for service in sorted(services):
            item.add_marker(getattr(pytest.mark, service)(*sorted(tools) if service == "tools" else ()))
        module, test = _module_and_name(item)
        if module in SLOW_MODULES or test in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


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
