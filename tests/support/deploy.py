"""The Kubernetes deployment (deploy/kubernetes) as a test reads it: its resources, each workload's
pod and container, the environment a container is given, and a wrapper that runs a command on a
read-only root file system, as `readOnlyRootFilesystem` does."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from app.core.config import ENV_PREFIX, Settings
from tests.support import create_empty_postgres_database, drop_postgres_database
from tests.support.ops import ROOT

DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
SECRET_EXAMPLE = DEPLOY / "secret.example.yaml"
CONFIG_MAP = "xmtp-push"
# The settings that hold a secret: a key, a token, or a URL that may carry a password.
SECRET_SETTINGS = frozenset(
    ENV_PREFIX + name
    for name in (
        "DATABASE_URL",
        "DATABASE_READ_URL",
        "REDIS_URL",
        "APNS_KEY",
        "FCM_SERVICE_ACCOUNT",
        "INGEST_TOKEN",
        "MARMOT_SECRET_KEY",
    )
)
# The port settings a probe may point at.
PORT_SETTINGS = tuple(f"{ENV_PREFIX}{name}_PORT" for name in ("HTTP", "GRPC", "METRICS"))
# Every writable mount the command could reach (the root, the temporary folder, the working folder
# and home) is made read-only in a mount namespace of its own; a probe write proves it, then the
# command runs in place of the shell.
READ_ONLY = (
    "unshare",
    "--map-root-user",
    "--mount",
    "sh",
    "-c",
    'for place in / /tmp "$PWD" "$HOME"; do mount -o remount,bind,ro "$(stat -c %m "$place")" || exit 96; done;'
    ' if touch "$PWD/.read-only-probe" 2>/dev/null; then exit 97; fi; exec "$@"',
    "read-only",
)


@dataclass(frozen=True)
class Workload:
    """A Deployment or Job of the deployment, by the xmtp-push command its one container runs."""

    kind: str
    name: str
    resource: dict[str, Any]

    @property
    def pod(self) -> dict[str, Any]:
        return dict(self.resource["spec"]["template"]["spec"])

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.resource["spec"]["template"]["metadata"].get("annotations", {}))

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]
        return dict(container)

    @property
    def command(self) -> str:
        return str(self.container["args"][0])

    def port(self, port: int | str) -> int:
        """A port number, or a container port's name, as a number."""
        if isinstance(port, int):
            return port
        named = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        return int(named[port])


def documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as file:
        return [doc for doc in yaml.safe_load_all(file) if doc]


def applied_files() -> list[Path]:
    """The files kustomization.yaml applies, in its order."""
    return [DEPLOY / name for name in documents(KUSTOMIZATION)[0]["resources"]]


def resources() -> list[dict[str, Any]]:
    return [doc for path in applied_files() for doc in documents(path)]


def find(kind: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def workloads() -> dict[str, Workload]:
    """Each Deployment and Job by the command it runs (one workload a command)."""
    found = [
        Workload(r["kind"], r["metadata"]["name"], r)
        for r in resources()
        if r["kind"] in ("Deployment", "Job")
    ]
    by_command = {w.command: w for w in found}
    assert len(by_command) == len(found), "two workloads run the same command"
    return by_command


def config_map() -> dict[str, str]:
    return {str(k): str(v) for k, v in find("ConfigMap", CONFIG_MAP)["data"].items()}


def example_secrets() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc["stringData"] for doc in documents(SECRET_EXAMPLE)}


def setting_names() -> frozenset[str]:
    """Every environment variable the product reads as a setting (app/core/config.py)."""
    return frozenset(ENV_PREFIX + field.upper() for field in Settings.model_fields)


def environment(workload: Workload) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each variable a container sets by name (`env:`), with its definition."""
    for variable in workload.container.get("env", []):
        yield variable["name"], variable


def uses_config_map(workload: Workload) -> bool:
    refs = workload.container.get("envFrom", [])
    return any(ref.get("configMapRef", {}).get("name") == CONFIG_MAP for ref in refs)


def container_env(workload: Workload, secrets: dict[str, str]) -> dict[str, str]:
    """What the container's environment holds: the ConfigMap, then its own variables, a Secret's
    key taken from `secrets` (an optional one left out when `secrets` has no value for it)."""
    env = config_map() if uses_config_map(workload) else {}
    for name, variable in environment(workload):
        if "value" in variable:
            env[name] = str(variable["value"])
            continue
        ref = variable["valueFrom"]["secretKeyRef"]
        if ref["key"] in secrets:
            env[name] = secrets[ref["key"]]
        else:
            assert ref.get("optional"), f"{workload.name}: {name} needs the secret key {ref['key']}"
    return env


def cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * units[unit]


def image_user_id() -> int:
    """The uid the Dockerfile runs the image as."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    created = re.search(r"useradd [^\n]*--uid (\d+)[^\n]*\s([\w-]+)[ \\]*$", dockerfile, re.MULTILINE)
    assert user and created and created.group(2) == user.group(1), (
        "the Dockerfile's USER is not the user it adds"
    )
    return int(created.group(1))


@contextlib.asynccontextmanager
async def empty_database() -> AsyncIterator[str]:
    """A PostgreSQL database without the schema; its SQLAlchemy URL."""
    url = await create_empty_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(url)


async def schema_version(url: str) -> str | None:
    """The database's Alembic revision."""
    connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return await connection.fetchval("SELECT version_num FROM alembic_version")  # type: ignore[no-any-return]
    finally:
        await connection.close()
