"""The libraries the product adjusts are the exact versions the adjustments were written against
(docs/upstream/): an upgrade fails here until someone has read the library's changes against that page
and moved the pin in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "docs" / "upstream"
# Each adjusted library and the page that says what is adjusted and how upstream stands.
ADJUSTED = {
    "aioapns": "aioapns.md",
    "firebase-admin": "firebase-admin.md",
    "coincurve": "coincurve.md",
    "aiohttp": "README.md",
    "httpx": "README.md",
    "pywebpush": "README.md",
    "py-vapid": "README.md",
    "http-ece": "README.md",
    "grpcio": "README.md",
    "pyjwt": "README.md",
}
EXACT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;,\s]+)$")


def exact_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {}
    for requirement in project["dependencies"]:
        if found := EXACT.match(requirement.strip()):
            pins[found.group(1).lower()] = found.group(2)
    return pins


def test_every_adjusted_library_is_pinned_exactly_and_installed_at_its_pin() -> None:
    pins = exact_pins()
    for name in ADJUSTED:
        assert name in pins, f"{name} is adjusted (docs/upstream/) but not pinned with == in pyproject.toml"
        installed = metadata.version(name)
        assert installed == pins[name], (
            f"{name} {installed} is installed, the adjustments were written for {pins[name]}:"
            f" see docs/upstream/{ADJUSTED[name]} before moving the pin"
        )


def test_every_adjusted_library_has_its_page_naming_the_pin() -> None:
    pins = exact_pins()
    table = (UPSTREAM / "README.md").read_text(encoding="utf-8")
    for name, page in ADJUSTED.items():
        assert (UPSTREAM / page).is_file(), page
        assert f"`{pins[name]}`" in table, f"docs/upstream/README.md does not give {name}'s pin {pins[name]}"
