"""What an edge or a loop does with an error: an outage is told once per change of state, naming the
setting; anything else is a bug, logged with its stack every time."""

from __future__ import annotations

import logging

import pytest
import redis.exceptions

from app.core.dependencies import DependencyLog
from app.ops.failures import REDIS_UNREACHABLE, tell_or_log

log = logging.getLogger("tests.failures")


def refused() -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def test_an_outage_is_told_once_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    dependencies = DependencyLog()
    with caplog.at_level(logging.DEBUG):
        told = [
            tell_or_log(refused(), dependencies, "ingest answers 503", log, "ingest failed") for _ in range(3)
        ]
    assert all(failure is not None and failure.code == REDIS_UNREACHABLE for failure in told)
    assert dependencies.is_down("redis")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            logging.WARNING,
            "XMTP_PUSH_REDIS_URL: Redis is unreachable (ConnectionError); ingest answers 503",
        )
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_anything_else_is_a_bug_logged_with_its_stack_each_time(caplog: pytest.LogCaptureFixture) -> None:
    dependencies = DependencyLog()
    with caplog.at_level(logging.DEBUG):
        for _ in range(2):
            try:
                {}["missing"]
            except KeyError as error:
                assert tell_or_log(error, dependencies, "ingest answers 503", log, "ingest failed") is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, "ingest failed")] * 2
    assert all(r.exc_info is not None and r.exc_info[0] is KeyError for r in caplog.records)
    assert not dependencies.is_down("redis") and not dependencies.is_down("database")
