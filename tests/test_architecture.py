"""The tests' own structure: no module of tests/ imports a test module (`test_*.py`).

What several test modules share lives in tests/conftest.py and the package tests/support/ (its
modules, and the plugin conftest registers, tests/support/fakes.py), so moving or deleting one test
module breaks no other. The product's structure is held by the import contracts: `lint-imports` in
`make lint`, [tool.importlinter] in pyproject.toml.
"""

from __future__ import annotations

import ast

from tests.support.sources import found_in_test_modules


def is_test_module(name: str) -> bool:
    """`tests.test_x`, `test_x` or (relative) `.test_x`, with or without a name inside it."""
    parts = name.lstrip(".").split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and parts[0].startswith("test_")


def imported_test_modules(source: str) -> list[str]:
    """The test modules that `source` imports, wherever the import stands (top level or in a function)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if is_test_module(alias.name)}
        elif isinstance(node, ast.ImportFrom):
            package = "." * node.level + (node.module or "")
            if is_test_module(package):
                names.add(package)
            else:  # `from tests import test_x`, `from . import test_x`
                joined = (
                    f"{package}.{alias.name}" if node.module else f"{package}{alias.name}"
                    for alias in node.names
                )
                names |= {name for name in joined if is_test_module(name)}
    return sorted(names)


def test_the_check_finds_every_form_of_import() -> None:
    source = """
import tests.test_a
import tests.test_b as b
from tests.test_c import helper
from tests import support
from tests import test_d
from .test_e import fixture
from . import test_f
import test_g
from tests.support.cli import run
from tests.support import ops as ops_support
from fakes import keys
import pytest

def later():
    from tests.test_h import value
"""
    assert imported_test_modules(source) == [
        ".test_e",
        ".test_f",
        "test_g",
        "tests.test_a",
        "tests.test_b",
        "tests.test_c",
        "tests.test_d",
        "tests.test_h",
    ]


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    found = found_in_test_modules(imported_test_modules)
    assert found == {}, "move what they share into tests/conftest.py or a module of tests/support/"
