"""deploy/: the alert rules pass promtool (their syntax, and rule tests that fire each alert on
synthetic series and keep it quiet on healthy ones), Prometheus's configuration scrapes every
xmtp-push process of the compose file, the dashboard's and the rules' queries name only metrics we
export, and the compose file's `monitoring` profile mounts these files."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import app.core.metrics  # noqa: F401  (registers every metric we export)
from app.ops.healthcheck import served_command
from tests.support import pipeline as pipeline_support
from tests.support.ops import (
    ROOT,
    channel_env,
    child_env,
    command,
    compose_config,
    example_env,
    free_port,
    required_tool,
    run_child,
)
from tests.support.process import child, wait_answering

redis_url = pipeline_support.redis_url

DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "xmtp-push.json"
# Series Prometheus makes itself, beside what our processes export.
PROMETHEUS_OWN = {"up"}
# PromQL words that are not series names: aggregations, functions (followed by "(") and operators.
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported() -> set[str]:
    """Every series name this codebase's processes can export (prometheus_client's own included)."""
    names = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def series_names(expr: str) -> set[str]:
    """The series a PromQL expression selects (strings, matchers, ranges and groupings left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[found.end() :].lstrip().startswith("(") or found.group() in KEYWORDS:
            continue  # a function or an aggregation
        names.add(found.group())
    return names


def dashboard_panels() -> list[dict[str, Any]]:
    document = json.loads(DASHBOARD.read_text())
    return [p for p in document["panels"] if p["type"] != "row"]


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def test_series_names_are_read_out_of_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, channel) (rate(xmtp_push_delivery_seconds_bucket{channel=~"a|b"}'
        '[$__rate_interval]))) / ignoring(x) up{job="xmtp-push"} and time() - process_start_time_seconds'
    )
    assert series_names(expr) == {"xmtp_push_delivery_seconds_bucket", "up", "process_start_time_seconds"}


@pytest.mark.tools("promtool")
def test_promtool_checks_and_tests_the_alert_rules() -> None:
    promtool = required_tool("promtool", "prometheus")
    folder = RULES.parent
    checked = asyncio.run(run_child([promtool, "check", "rules", str(RULES)], child_env()))
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, checked
    tested = asyncio.run(run_child([promtool, "test", "rules", str(folder / "alerts_test.yml")], child_env()))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested
    # Every alert has a rule test that expects it to fire.
    tests = yaml.safe_load((folder / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    assert fired == set(rule_exprs())


@pytest.mark.tools("promtool")
def test_prometheus_scrapes_every_process_of_the_compose_file(tmp_path: Path) -> None:
    promtool = required_tool("promtool", "prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]  # where the compose file mounts it
    # As the compose file mounts it, but here: promtool checks the rules it names exist and parse.
    config["rule_files"] = [str(shutil.copy(RULES, tmp_path / "alerts.yml"))]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = asyncio.run(
        run_child([promtool, "check", "config", str(tmp_path / "prometheus.yml")], child_env())
    )
    assert checked.returncode == 0, checked

    [job] = config["scrape_configs"]
    assert job["job_name"] == "xmtp-push"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    serving = {
        name: s["command"][0] for name, s in compose.items() if "build" in s and s["command"] != ["migrate"]
    }
    ports = {"api": 8080, "worker": 9464, "listen": 9464}
    assert targets == {f"{name}:{ports[command]}" for name, command in serving.items()}


def test_the_dashboard_and_the_rules_name_only_metrics_we_export() -> None:
    known = exported() | PROMETHEUS_OWN
    used: set[str] = set()
    for panel in dashboard_panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = series_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            assert names <= known, (panel["title"], names - known)
            used |= names
    for alert, expr in rule_exprs().items():
        names = series_names(expr)
        assert names and names <= known, (alert, names - known)
    # What the dashboard is for: throughput by outcome, latency, backlog, the listener, each channel.
    assert {
        "xmtp_push_deliveries_total",
        "xmtp_push_delivery_seconds_bucket",
        "xmtp_push_queue_depth",
        "xmtp_push_queue_oldest_seconds",
        "xmtp_push_listener_lag_seconds",
        "xmtp_push_credentials_ok",
        "xmtp_push_provider_connections",
        "xmtp_push_build_info",
        "up",
    } <= used


def test_every_metric_we_export_is_in_the_operations_table() -> None:
    table = (ROOT / "docs" / "operations.md").read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+)\|", table, re.MULTILINE)
    documented = {name for cell in first_cells for name in re.findall(r"`([a-z_]+)`", cell)}
    ours = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
        if family.name.startswith(("xmtp_push_", "grpc_server_"))
    }
    assert {"grpc_server_started_total", "grpc_server_handled_total", "grpc_server_handling_seconds"} <= ours
    assert ours - documented == set()


def test_the_dashboard_shows_failures_apart_and_in_red() -> None:
    panels = {p["title"]: p for p in dashboard_panels()}
    delivered = panels["Delivered per second, by channel"]["targets"][0]["expr"]
    failures = panels["Failures per second, by outcome"]
    assert 'outcome="delivered"' in delivered
    assert 'outcome=~"failed|rejected|mismatch|dead"' in failures["targets"][0]["expr"]
    colors = {
        o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
        for o in failures["fieldConfig"]["overrides"]
    }
    assert colors["failed"] == "red"


@pytest.mark.tools("docker-compose")
def test_the_monitoring_profile_mounts_the_deploy_files(tmp_path: Path) -> None:
    # The deployment's folder as an operator has it: the deploy files and a filled-in .env.
    (tmp_path / "deploy").symlink_to(DEPLOY)
    code, config, output = compose_config(tmp_path, example_env(), "--profile", "monitoring")
    assert code == 0, output
    services = config["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
        for volume in services[name]["volumes"]:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), (name, source)
    mounted = {
        v.split(":")[1] if isinstance(v, str) else v["target"] for v in services["prometheus"]["volumes"]
    }
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/alerts.yml"} <= mounted


@pytest.mark.tools("docker-compose")
async def test_the_workers_and_the_listener_are_checked_on_their_metrics_port(
    tmp_path: Path, postgresql_url: str, redis_url: str
) -> None:
    code, config, output = await asyncio.to_thread(compose_config, tmp_path, example_env())
    assert code == 0, output
    checks = {
        name: s["healthcheck"]["test"]
        for name, s in config["services"].items()
        if s.get("command") in (["worker"], ["listen"])
    }
    assert set(checks) == {"worker-1", "worker-2", "listener"}
    [check] = {tuple(test) for test in checks.values()}
    assert check[:3] == ("CMD", "python", "-c"), check
    # The check as the container runs it, against a worker that is ready and one that is not.
    ready = channel_env(postgresql_url, redis_url=redis_url, metrics_port="0")
    unready = channel_env(postgresql_url, redis_url=f"redis://127.0.0.1:{free_port()}/0", metrics_port="0")
    for env, healthy in ((ready, True), (unready, False)):
        async with child("worker", ["worker"], env) as worker:
            port = await worker.probe_port()
            await wait_answering(f"http://127.0.0.1:{port}/healthz")
            result = await run_child([sys.executable, "-c", check[3]], child_env(metrics_port=str(port)))
            assert (result.returncode == 0) is healthy, result
            assert await worker.stop() == 0, worker.output()


def test_the_health_check_reads_the_command_of_the_main_process() -> None:
    assert served_command(["/usr/local/bin/python", "/usr/local/bin/xmtp-push", "worker"]) == "worker"
    assert served_command(["/sbin/docker-init", "--", "xmtp-push", "--debug", "listen"]) == "listen"
    assert served_command(["python", "-m", "workers.cli", "marmot"]) == "marmot"
    assert served_command(["/sbin/init", "splash"]) is None
    assert served_command([]) is None


async def test_the_image_checks_the_port_its_command_serves(postgresql_url: str, redis_url: str) -> None:
    """The image's HEALTHCHECK, run as Docker would inside a container of a worker, of the API, and of a
    worker whose Redis does not answer: the worker is asked on its metrics port, the API on its HTTP
    port (nothing else listens on either)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    found = re.search(r"^HEALTHCHECK .*\\\n\s+CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert found, "no HEALTHCHECK in exec form"
    check = json.loads(found.group(1))
    assert check[0] == "xmtp-push"
    ports = {"http_port": str(free_port()), "metrics_port": str(free_port())}
    grpc = {"grpc_port": str(free_port())}
    ready = channel_env(postgresql_url, redis_url=redis_url, **ports, **grpc)
    unready = channel_env(postgresql_url, redis_url=f"redis://127.0.0.1:{free_port()}/0", **ports, **grpc)
    cases = (
        (["worker"], ready, "metrics_port", True),
        (["api"], ready, "http_port", True),
        (["worker"], unready, "metrics_port", False),
    )
    for args, env, port, healthy in cases:
        async with child(args[0], args, env) as process:
            await wait_answering(f"http://127.0.0.1:{ports[port]}/healthz")
            pid = str(process.process.pid)
            result = await run_child([*command(), *check[1:], "--pid", pid], env)
            assert (result.returncode == 0) is healthy, (result, process.output())
            setting = f"XMTP_PUSH_{port.upper()} ({ports[port]})"
            verdict = "is ready" if healthy else "/readyz answered 503"
            assert (
                result.stdout.strip()
                == f"{'ok' if healthy else 'unhealthy'}: `{args[0]}` on {setting}"
                + (f" {verdict}" if healthy else f": {verdict}")
            ), result
            assert await process.stop() == 0, process.output()
