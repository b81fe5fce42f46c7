"""What an operator relies on in the Kubernetes deployment (deploy/kubernetes): every resource valid,
every long-running command with its workload, every variable a setting, secrets only from the Secret,
pods as the image's user within bounds, and each process, started with the environment its manifest
gives it on a read-only root, answering its probes on the port the manifest points them at and
stopping cleanly on SIGTERM within its grace period.

The processes are the real console script against the test PostgreSQL and Redis; a local Nostr relay
stands in for the Marmot server's relays.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import kubernetes_validate
import pytest

from app.ops.healthcheck import ON_METRICS_PORT, SERVE_NOTHING
from fakes import keys
from fakes.fake_xmtpd import FakeXmtpd
from tests.support import deploy
from tests.support import ops as ops_support
from tests.support import pipeline as pipeline_support
from tests.support.marmot import running_relay
from tests.support.ops import child_env, free_port, run_child
from tests.support.process import START_SECONDS, Child, child
from workers.cli import COMMANDS
from workers.marmot_server import STOP_GRACE_SECONDS
from workers.server import GRACE_SECONDS

# The dedicated test Redis DB, flushed around each test that uses it.
redis_url = pipeline_support.redis_url

# The oldest Kubernetes the deployment needs (the preStop sleep action) and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# `marmot` has a parser of its own (--show-pubkey); `dev` is everything in one process, not for here.
LONG_RUNNING = (set(COMMANDS) | {"marmot"}) - SERVE_NOTHING - {"dev"}
PROBES = (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz"))
REPLICAS = {"api": 2, "listen": 2, "marmot": 2, "gateway": 2}
# Settings docs/scaling.md adds (database replica, Redis Cluster, queue partitions), named by the deployment
# before app/core/config.py has them: allowed, and only these, while they are not settings yet.
PROVIDER_TIMEOUT_MAX = next(
    m.le for m in deploy.Settings.model_fields["provider_timeout_seconds"].metadata if hasattr(m, "le")
)
# How long each command may take after SIGTERM to finish what it holds (workers/server.py,
# workers/delivery_worker.py's drain, workers/marmot_server.py), before a preStop pause.
DRAIN_SECONDS = {
    "api": 2 * GRACE_SECONDS,  # HTTP, then gRPC
    "gateway": GRACE_SECONDS,
    "worker": PROVIDER_TIMEOUT_MAX + 5,
    "marmot": STOP_GRACE_SECONDS + PROVIDER_TIMEOUT_MAX,
}


def test_kustomization_applies_every_manifest_but_the_example_secret() -> None:
    shipped = {path.name for path in deploy.DEPLOY.glob("*.yaml")}
    applied = {path.name for path in deploy.applied_files()}
    assert applied == shipped - {deploy.KUSTOMIZATION.name, deploy.SECRET_EXAMPLE.name}
    assert all(r["kind"] != "Secret" for r in deploy.resources()), (
        "a placeholder secret would overwrite a real one"
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_is_valid_for_kubernetes(version: str) -> None:
    paths = [*deploy.applied_files(), deploy.SECRET_EXAMPLE]
    for doc in (doc for path in paths for doc in deploy.documents(path)):
        # Strict: an unknown field fails; a kind without a schema raises SchemaNotFoundError.
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_long_running_command_has_its_workload() -> None:
    workloads = deploy.workloads()
    assert set(workloads) == LONG_RUNNING | {"migrate"}
    assert workloads["migrate"].kind == "Job"
    for command in LONG_RUNNING:
        assert workloads[command].kind == "Deployment", command
    for command, replicas in REPLICAS.items():
        assert workloads[command].resource["spec"]["replicas"] == replicas, command
    worker = workloads["worker"].resource
    assert "replicas" not in worker["spec"], "the autoscaler owns the worker count"
    autoscaler = deploy.find("HorizontalPodAutoscaler", worker["metadata"]["name"])["spec"]
    assert autoscaler["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "worker"}
    assert autoscaler["minReplicas"] >= 2
    (metric,) = autoscaler["metrics"]
    assert metric["resource"]["name"] == "cpu"


def test_services_reach_the_ports_the_processes_serve() -> None:
    settings = deploy.Settings(
        **{k.removeprefix("XMTP_PUSH_").lower(): v for k, v in deploy.config_map().items()}
    )
    expected = {"api": {settings.http_port, settings.grpc_port}, "gateway": {settings.http_port}}
    workloads = deploy.workloads()
    for command, ports in expected.items():
        service = deploy.find("Service", workloads[command].name)["spec"]
        assert service["selector"] == workloads[command].resource["spec"]["selector"]["matchLabels"]
        assert {workloads[command].port(p["targetPort"]) for p in service["ports"]} == ports, command


def test_every_variable_named_is_a_setting() -> None:
    named = set(deploy.config_map())
    for workload in deploy.workloads().values():
        named |= {name for name, _ in deploy.environment(workload)}
    unknown = named - deploy.setting_names()
    assert not unknown, f"not settings of app/core/config.py: {sorted(unknown)}"


def test_secrets_come_from_the_secret_and_never_from_the_config_map() -> None:
    assert not deploy.SECRET_SETTINGS & set(deploy.config_map()), "a secret in the ConfigMap"
    assert not any("@" in value for value in deploy.config_map().values()), "credentials in a ConfigMap URL"
    secrets = deploy.example_secrets()
    for workload in deploy.workloads().values():
        for name, variable in deploy.environment(workload):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            assert (ref is not None) == (name in deploy.SECRET_SETTINGS), f"{workload.name}: {name}"
            if ref is not None:
                assert ref["key"] in secrets[ref["name"]], (
                    f"{workload.name}: no key {ref['key']} in the example"
                )
    needs = {"api": {"DATABASE_URL", "REDIS_URL"}, "worker": {"DATABASE_URL", "REDIS_URL"}}
    needs |= {"listen": {"DATABASE_URL", "REDIS_URL"}, "marmot": {"MARMOT_SECRET_KEY", "REDIS_URL"}}
    needs |= {"gateway": {"REDIS_URL"}, "migrate": {"DATABASE_URL"}}
    for command, names in needs.items():
        given = {name for name, _ in deploy.environment(deploy.workloads()[command])}
        assert {f"XMTP_PUSH_{n}" for n in names} <= given, command


def test_the_gateway_reads_its_apps_from_the_mounted_secret() -> None:
    gateway = deploy.workloads()["gateway"]
    apps = dict(deploy.environment(gateway))["XMTP_PUSH_MATRIX_APPS"]["value"]
    (mount,) = gateway.container["volumeMounts"]
    (volume,) = gateway.pod["volumes"]
    assert Path(apps).parent == Path(mount["mountPath"]) and mount["name"] == volume["name"]
    assert Path(apps).name in deploy.example_secrets()[volume["secret"]["secretName"]]


def test_pods_run_as_the_images_user_read_only_and_within_bounds() -> None:
    uid = deploy.image_user_id()
    for workload in deploy.workloads().values():
        pod, container = workload.pod["securityContext"], workload.container
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == uid, workload.name
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, workload.name
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, workload.name
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], workload.name
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert deploy.cpu_millis(requests["cpu"]) <= deploy.cpu_millis(limits["cpu"]), workload.name
        assert deploy.memory_bytes(requests["memory"]) <= deploy.memory_bytes(limits["memory"]), workload.name


def test_grace_periods_cover_each_drain() -> None:
    for command, drain in DRAIN_SECONDS.items():
        workload = deploy.workloads()[command]
        pause = workload.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert workload.pod["terminationGracePeriodSeconds"] > pause + drain, command


# --- each process as its manifest starts it, on a read-only root -----------------------------------


def secrets(database_url: str, redis_url: str = "redis://unused") -> dict[str, str]:
    """The Secret's keys, pointed at the test's PostgreSQL and Redis (FCM left out: optional)."""
    return {
        "database-url": database_url,
        "database-read-url": database_url,
        "redis-url": redis_url,
        "apns-key": keys.apns_key_pem(),
        "ingest-token": "deploy-test-token",
        "marmot-secret-key": "11" * 32,
    }


def matrix_apps(folder: Path) -> str:
    key = folder / "AuthKey.p8"
    key.write_text(keys.apns_key_pem())
    apps = folder / "sygnal.yaml"
    apps.write_text(
        "apps:\n  org.example.app:\n    type: apns\n"
        f"    keyfile: {key}\n    key_id: KEYID12345\n    team_id: TEAMID1234\n    topic: org.example.app\n"
    )
    return str(apps)


def process_env(
    workload: deploy.Workload, database_url: str, redis_url: str, relay: str, apps: str, xmtpd: str
) -> tuple[dict[str, str], dict[int, int]]:
    """The container's environment with stand-ins for what the cluster provides (the xmtpd node, the
    relays, the mounted apps file, the channel's ids the operator fills in), every port setting
    moved to a free port; and each manifest port's free port."""
    env = deploy.container_env(workload, secrets(database_url, redis_url))
    ports = {name: free_port() for name in deploy.PORT_SETTINGS if name in env}
    moved = {int(env[name]): port for name, port in ports.items()}
    assert len(moved) == len(ports), "two port settings share a port"
    env |= {name: str(port) for name, port in ports.items()}
    env |= {"XMTP_PUSH_XMTPD_ADDRESS": xmtpd, "XMTP_PUSH_XMTPD_TLS": "false"}
    env |= {"XMTP_PUSH_MARMOT_RELAYS": relay, "XMTP_PUSH_APNS_KEY_ID": "KEYID12345"}
    env |= {"XMTP_PUSH_MARMOT_ALLOW_UNENCRYPTED_RELAYS": "true"}  # the test's relay: ws:// on loopback
    env |= {"XMTP_PUSH_APNS_TEAM_ID": "TEAMID1234", "XMTP_PUSH_APNS_BUNDLE_ID": "org.example.app"}
    if "XMTP_PUSH_MATRIX_APPS" in env:
        env["XMTP_PUSH_MATRIX_APPS"] = apps
    return child_env() | env, moved


async def answered(url: str, process: Child) -> httpx.Response:
    """GET `url` until it answers 200, while the process runs."""
    deadline = time.monotonic() + START_SECONDS
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            assert process.process.returncode is None, f"{url}: the process ended\n{process.output()}"
            with contextlib.suppress(httpx.HTTPError):
                if (response := await client.get(url)).status_code == 200:
                    return response
            assert time.monotonic() < deadline, f"{url} did not answer 200\n{process.output()}"
            await asyncio.sleep(0.1)


def probe_url(workload: deploy.Workload, moved: dict[int, int], probe: str, path: str) -> str:
    get = workload.container[probe]["httpGet"]
    assert get["path"] == path, f"{workload.name}: {probe}"
    port = workload.port(get["port"])
    assert port in moved, f"{workload.name}: {probe} on {port}, which no port setting names"
    return f"http://127.0.0.1:{moved[port]}{path}"


@pytest.mark.parametrize("command", sorted(LONG_RUNNING))
async def test_each_process_answers_its_probes_on_a_read_only_root(
    command: str, postgresql_url: str, redis_url: str, tmp_path: Path
) -> None:
    workload = deploy.workloads()[command]
    # `listen` is ready only with its firehose open: a fake xmtpd node stands in for the network's.
    async with running_relay() as relay, FakeXmtpd() as xmtpd:
        apps = matrix_apps(tmp_path)
        env, moved = process_env(workload, postgresql_url, redis_url, relay.url, apps, xmtpd.address)
        async with child(command, list(workload.container["args"]), env, deploy.READ_ONLY) as process:
            for probe, path in PROBES:
                await answered(probe_url(workload, moved, probe, path), process)
            scrape = moved[int(workload.annotations["prometheus.io/port"])]
            metrics = await answered(
                f"http://127.0.0.1:{scrape}{workload.annotations['prometheus.io/path']}", process
            )
            assert "xmtp_push_build_info" in metrics.text
            asked_to_stop = time.monotonic()
            assert await process.stop() == 0, process.output()
            assert time.monotonic() - asked_to_stop < workload.pod["terminationGracePeriodSeconds"]
    assert workload.annotations["prometheus.io/scrape"] == "true"
    assert not [line for line in process.lines if "Read-only file system" in line], process.output()
    # Which port each probe belongs on, by the product's own rule (the image's health check).
    expected = "XMTP_PUSH_METRICS_PORT" if command in ON_METRICS_PORT else "XMTP_PUSH_HTTP_PORT"
    assert workload.port(workload.container["readinessProbe"]["httpGet"]["port"]) == int(
        deploy.config_map()[expected]
    )


@pytest.mark.postgres
async def test_the_migrate_job_migrates_on_a_read_only_root() -> None:
    migrate = deploy.workloads()["migrate"]
    async with deploy.empty_database() as url:
        env = child_env() | deploy.container_env(migrate, secrets(url))
        result = await run_child([*deploy.READ_ONLY, *ops_support.command(), *migrate.container["args"]], env)
        assert result.returncode == 0, str(result)
        assert await deploy.schema_version(url) is not None
