"""The systemd layout (deploy/systemd, docs/operations.md): a unit per long-running command, each
running a real command of the console script with the one settings file and the usual hardening."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest

from app.core.config import ENV_PREFIX, Settings
from app.ops.healthcheck import CONSOLE_SCRIPT, SERVE_NOTHING
from tests.support.ops import ROOT
from workers.cli import COMMANDS

SYSTEMD = ROOT / "deploy" / "systemd"
SETTINGS_FILE = "/etc/xmtp-push/xmtp-push.env"
# `marmot` has a parser of its own; `dev` is everything in one process, not for production.
LONG_RUNNING = (set(COMMANDS) | {"marmot"}) - SERVE_NOTHING - {"dev"}
TEMPLATES = {"worker"}  # run as many as you like: one instance each
HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}
UNITS = sorted(SYSTEMD.glob("*.service"))


def unit(path: Path) -> configparser.RawConfigParser:
    # systemd allows a key twice (the later wins, as here) and keys without a value.
    parser = configparser.RawConfigParser(strict=False, allow_no_value=True, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def command_of(path: Path) -> str:
    program, command, *_ = shlex.split(unit(path)["Service"]["ExecStart"])
    assert Path(program).name == CONSOLE_SCRIPT, path.name
    return command


def test_every_long_running_command_has_a_unit_named_after_it() -> None:
    expected = {f"xmtp-push-{c}{'@' if c in TEMPLATES else ''}.service" for c in LONG_RUNNING}
    assert expected <= {path.name for path in UNITS}
    for name in expected:
        command = command_of(SYSTEMD / name)
        assert name == f"xmtp-push-{command}{'@' if command in TEMPLATES else ''}.service"


@pytest.mark.parametrize("path", UNITS, ids=lambda path: path.name)
def test_each_unit_runs_a_command_of_the_console_script_with_the_settings_file_hardened(path: Path) -> None:
    service = unit(path)["Service"]
    assert command_of(path) in set(COMMANDS) | {"marmot"}
    assert service["EnvironmentFile"] == SETTINGS_FILE
    assert service.get("DynamicUser") == "yes" or service.get("User"), "runs as root"
    for key, value in HARDENING.items():
        assert service.get(key) == value, f"{path.name}: {key}"
    if service.get("Type") != "oneshot":
        assert service.get("Restart") == "on-failure"
        assert unit(path)["Install"]["WantedBy"] == "multi-user.target"


def test_the_workers_instance_is_its_metrics_port_and_the_settings_file_sets_none() -> None:
    worker = unit(SYSTEMD / "xmtp-push-worker@.service")["Service"]
    assert worker["Environment"] == f"{ENV_PREFIX}METRICS_PORT=%i"
    example = (SYSTEMD / "xmtp-push.env.example").read_text().splitlines()
    names = [
        line.lstrip("# ").split("=", 1)[0] for line in example if line.lstrip("# ").startswith(ENV_PREFIX)
    ]
    assert names and f"{ENV_PREFIX}METRICS_PORT" not in names
    assert all(name.removeprefix(ENV_PREFIX).lower() in Settings.model_fields for name in names)


def test_the_operations_page_shows_the_systemd_layout_beside_compose_and_kubernetes() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    layouts = page.split("## Production layouts", 1)[1].split("\n## ", 1)[0]
    for shape in ("`docker-compose.yml`", "`deploy/systemd/`", "`deploy/kubernetes/`"):
        assert shape in layouts
    for path in UNITS:
        assert f"`{path.name}`" in page
    assert SETTINGS_FILE in page
