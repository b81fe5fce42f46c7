"""requirements.lock pins every dependency pyproject.toml names (all extras), at a version its
specifier admits: a dependency added or re-pinned without `make lock` fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
# The image and CI: Linux, CPython 3.11.
TARGET = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11"}


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        names += extra
    return [Requirement(name) for name in names]


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_the_lock_pins_every_direct_dependency_at_an_admitted_version() -> None:
    pins = locked()
    problems = []
    for requirement in direct_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
            continue
        version = pins.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name} is not in requirements.lock")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}=={version} is outside {requirement.specifier}")
    assert not problems, "run `make lock` and commit requirements.lock: " + "; ".join(problems)


def test_the_lock_is_installed_as_constraints() -> None:
    """As constraints, not requirements: a dependency not yet locked still installs."""
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install -c $(LOCK) -e '.[dev]'" in makefile
    assert "pip install -c /tmp/xmtp-push/requirements.lock /tmp/xmtp-push" in dockerfile
    assert len(locked()) > len(direct_requirements())  # transitive dependencies are pinned too
