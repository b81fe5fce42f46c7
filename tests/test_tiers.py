"""The test tiers stay true: every test the tables of tests/support/tiers.py name exists (a renamed test
would lose its markers), and `make test-fast` leaves out every marker pyproject.toml registers."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.support import tiers as tiers_support

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def functions(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_tables_name_exists() -> None:
    named = [needs.test for needs in tiers_support.TESTS] + sorted(tiers_support.SLOW_TESTS)
    named += sorted(tiers_support.SLOW_MODULES)
    missing = []
    for entry in named:
        module, _, test = entry.partition("::")
        if not (TESTS / module).exists() or (test and test not in functions(module)):
            missing.append(entry)
    assert missing == []


def test_every_fixture_the_tables_name_exists() -> None:
    defined = set().union(*(functions(str(path.relative_to(TESTS))) for path in TESTS.rglob("*.py")))
    assert set(tiers_support.FIXTURES) | set(tiers_support.PARAMETERS) <= defined


def test_test_fast_leaves_out_every_registered_marker() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {re.split(r"[:(]", marker, maxsplit=1)[0] for marker in options["markers"]}
    found = re.search(r"^NOT_FAST := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found is not None
    assert set(found.group(1).split(" or ")) == registered
