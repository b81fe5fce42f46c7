"""The test tiers stay true: the fixtures tests/support/tiers.py names exist, no module of the tests
lists test names (markers are written where the tests are), `make test-fast` leaves out every marker
pyproject.toml registers, and a test of the fast tier that takes longer than its bound fails, named."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import tiers as tiers_support
from tests.support.sources import found_in_test_modules

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# A test's name as a string: `test_x.py::test_y`, or a module's `test_x.py` beside a test's name.
TEST_NAME = re.compile(r"test_\w+\.py::\w+|::test_\w+")


def functions(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_fixture_the_tables_name_exists() -> None:
    defined = set().union(*(functions(str(path.relative_to(TESTS))) for path in TESTS.rglob("*.py")))
    assert set(tiers_support.FIXTURES) | set(tiers_support.PARAMETERS) <= defined


def named_tests(source: str) -> list[str]:
    """The test names that string literals of `source` hold."""
    strings = (node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant))
    return [name for value in strings if isinstance(value, str) for name in TEST_NAME.findall(value)]


def test_the_check_finds_a_listed_test_name() -> None:
    source = 'SLOW = {"test_apns.py::test_connection_refused_is_transient"}\nALSO = ("::test_x",)\n'
    assert named_tests(source) == ["test_apns.py::test_connection_refused_is_transient", "::test_x"]


def test_no_module_of_the_tests_lists_test_names() -> None:
    found = found_in_test_modules(named_tests, leave_out=Path(__file__))  # this one, for its example
    assert found == {}, "mark the test where it is written: @pytest.mark.slow, @pytest.mark.tools(...)"


def test_test_fast_leaves_out_every_registered_marker() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {re.split(r"[:(]", marker, maxsplit=1)[0] for marker in options["markers"]}
    found = re.search(r"^NOT_FAST := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found is not None
    assert set(found.group(1).split(" or ")) == registered


WAITING_TESTS = """
import asyncio
import time

import pytest


def test_waits_unmarked():
    time.sleep(1.0)


@pytest.mark.slow
def test_waits_marked_slow():
    time.sleep(1.0)


async def test_waits_unmarked_in_the_event_loop():
    await asyncio.sleep(1.0)


def test_quick():
    pass
"""


@pytest.mark.slow
def test_a_fast_tier_test_over_its_bound_fails_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "test_waiting.py").write_text(WAITING_TESTS)
    # The tiers plugin alone, over a module of its own; bound 0.05 s (stretched by load, still far
    # under the one-second waits).
    plugin = ["-p", "tests.support.tiers", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    args = [sys.executable, "-m", "pytest", *plugin, "-c", str(ROOT / "pyproject.toml"), "-rf"]
    result = subprocess.run(
        [*args, "--fast-tier-seconds=0.05", str(tmp_path / "test_waiting.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 2 passed" in result.stdout, result.stdout
    assert "test_waiting.py::test_waits_unmarked took 1." in result.stdout, result.stdout
    assert "test_waiting.py::test_waits_unmarked_in_the_event_loop took 1." in result.stdout, result.stdout
    assert "mark it @pytest.mark.slow" in result.stdout, result.stdout
