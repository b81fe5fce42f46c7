"""The tests' own sources, read for the tests that hold their structure (test_architecture.py, test_tiers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def found_in_test_modules(
    find: Callable[[str], list[str]], *, leave_out: Path | None = None
) -> dict[str, list[str]]:
    """What `find` finds in the source of each module under tests/, by module (those with findings)."""
    modules = sorted(path for path in TESTS.rglob("*.py") if path != leave_out)
    assert len(modules) >= 50  # the tests were found
    return {
        str(module.relative_to(TESTS)): found
        for module in modules
        if (found := find(module.read_text(encoding="utf-8")))
    }
