"""`xmtp-push healthcheck`: the image's health check, whichever command the container runs.

Docker runs one HEALTHCHECK for every container of an image, but the commands serve their probes on
different ports: `api`, `dev`, `gateway`, `marmot` (and any other server) on XMTP_PUSH_HTTP_PORT,
`worker` and `listen` on XMTP_PUSH_METRICS_PORT. So the check reads which command the container's main
process runs (its arguments, from /proc: PID 1, or the child of `docker run --init`'s init, which names
it too) and asks that command's port for /readyz.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from app.core.config import Settings, SettingsError
from app.matrix.config import gateway_address, read_http_section

CHECK_SECONDS = 2.0
ON_METRICS_PORT = frozenset({"worker", "listen"})
# Commands that serve nothing: while they run there is nothing to ask.
SERVE_NOTHING = frozenset({"migrate", "send-test", "stats", "config", "healthcheck"})
CONSOLE_SCRIPT, MODULE = "xmtp-push", "workers.cli"
# Addresses that listen on every interface, and the loopback address that reaches them.
ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    line: str


def served_command(arguments: Sequence[str]) -> str | None:
    """The xmtp-push command a process's arguments run (`xmtp-push worker`, `python .../xmtp-push
    listen`, `docker-init -- xmtp-push api`, `python -m workers.cli api`), or None for another program."""
    for index, argument in enumerate(arguments):
        module = index > 0 and arguments[index - 1] == "-m" and argument == MODULE
        if PurePath(argument).name == CONSOLE_SCRIPT or module:
            return next((a for a in arguments[index + 1 :] if not a.startswith("-")), None)
    return None


def process_arguments(pid: int) -> list[str]:
    """A process's arguments; none when they cannot be read (no /proc, no such process)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def check(settings: Settings, command: str | None) -> Verdict:
    """/readyz of `command` on its port; a process that is not xmtp-push's is taken for the image's
    default command, `api`."""
    name = command or "api"
    if name in SERVE_NOTHING:
        return Verdict(True, f"ok: `{name}` serves nothing to check")
    setting, port = (
        ("XMTP_PUSH_METRICS_PORT", settings.metrics_port)
        if name in ON_METRICS_PORT
        else ("XMTP_PUSH_HTTP_PORT", settings.http_port)
    )
    host = settings.http_host
    if name == "gateway" and settings.matrix_apps:  # where it listens: the settings, else its file
        try:
            address = gateway_address(settings, read_http_section(settings.matrix_apps))
        except SettingsError as error:
            return Verdict(False, f"unhealthy: `gateway`: {error}")
        setting, port, host = address.port_from, address.port, address.hosts[0]
    where = f"`{name}` on {setting} ({port})"
    if port == 0:
        return Verdict(False, f"unhealthy: {where}: a port picked at start-up cannot be checked; set one")
    host = ANY_ADDRESS.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=CHECK_SECONDS) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        return Verdict(False, f"unhealthy: {where}: no answer ({type(error).__name__})")
    if status != 200:
        return Verdict(False, f"unhealthy: {where}: /readyz answered {status}")
    return Verdict(True, f"ok: {where} is ready")
