"""The markdown report of a `python -m bench` run: the machine, then one table per benchmark."""

from __future__ import annotations

import asyncio
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._proc import load_average
from bench._support import DEFAULT_ADMIN_DSN
from bench.suite import ROOT, StepRun, verdict_counts

PLOT_NAME = "throughput-latency.png"


def _first_line(path: str, prefix: str) -> str | None:
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _first_line("/proc/cpuinfo", "model name") or platform.processor() or "unknown"


def memory() -> str:
    total = _first_line("/proc/meminfo", "MemTotal")
    if not total:
        return "unknown"
    return f"{int(total.split()[0]) / 2**20:.1f} GiB"


def postgres_version(dsn: str = DEFAULT_ADMIN_DSN) -> str:
    from bench._support import server_version

    try:
        return asyncio.run(server_version(dsn))
    except Exception as error:  # reported, not fatal: the steps will say more
        return f"unreachable ({type(error).__name__})"


def redis_version(url: str = "redis://127.0.0.1:6379/0") -> str:
    try:
        from redis import Redis

        client = Redis.from_url(url, socket_timeout=2)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()
    except Exception as error:
        return f"unreachable ({type(error).__name__})"


def git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    revision = git("rev-parse", "--short", "HEAD")
    if not revision:
        return "unknown"
    return revision + (" with uncommitted changes" if git("status", "--porcelain") else "")


@dataclass
class Machine:
    date: str
    rows: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def describe(cls) -> Machine:
        cpus = os.cpu_count() or 0
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
        machine = cls(datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
        machine.rows = [
            ("nproc", str(usable) + ("" if usable == cpus else f" (of {cpus} on the host)")),
            ("CPU", cpu_model()),
            ("memory", memory()),
            ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
            ("OS", platform.platform()),
            ("PostgreSQL", postgres_version()),
            ("Redis", redis_version()),
            ("git", git_revision()),
            ("load average at start", load_average()),
        ]
        return machine


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def relative(path: Path, out: Path) -> str:
    return os.path.relpath(path, out)


def step_section(run: StepRun, out: Path) -> list[str]:
    lines = [f"## {run.step.name}: {run.step.title}", ""]
    log = relative(run.log, out)
    when = f"ran {run.finished}; " if run.finished else ""
    lines.append(
        f"{when}{_seconds(run.seconds)}, exit {run.exit_code}; full output: [{log}]({log}). Reproduce:"
    )
    lines += ["", "```sh", run.command, "```", ""]
    if run.results is None:
        lines += ["**No results**: the run ended before writing them; see the end of its log.", ""]
        return lines
    if (
        run.results.get("benchmark") == "pipeline"
    ):  # the scenario, mode and database, as the script names them
        lines += [f"Run: {run.results['title']}.", ""]
    rows = [(m["name"], m["display"], m["target"], m["verdict"]) for m in run.results["metrics"]]
    lines += [*table(("metric", "value", "target", "verdict"), rows), ""]
    return lines


def _seconds(seconds: float) -> str:
    return "? s" if math.isnan(seconds) else f"{seconds:.0f} s"


def overview(runs: Sequence[StepRun]) -> list[str]:
    rows = [
        (f"[{r.step.name}](#{anchor(r)})", r.step.title, verdict_counts(r), _seconds(r.seconds)) for r in runs
    ]
    return [*table(("benchmark", "what", "verdicts", "time"), rows), ""]


def anchor(run: StepRun) -> str:
    """GitHub's anchor for the step's heading."""
    heading = f"{run.step.name}: {run.step.title}".lower()
    kept = "".join(c for c in heading if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def render(
    machine: Machine,
    runs: Sequence[StepRun],
    out: Path,
    suite_command: str,
    quick: bool,
    plot_note: str | None,
    total_seconds: float,
    updated: Sequence[str] | None = None,
) -> str:
    mode = (
        "quick mode: small sizes and short durations, a smoke run whose numbers are not comparable with "
        "full runs"
        if quick
        else "full sizes and durations"
    )
    ran = f"{len(runs)} benchmark(s) in {total_seconds / 60:.1f} min."
    if updated is not None:
        ran = (
            f"updated {', '.join(updated)} in {total_seconds / 60:.1f} min; the other sections are kept from "
            "earlier runs (each section gives when it ran; the machine below is the latest run's)."
        )
    lines = [
        "# xmtp-push benchmarks",
        "",
        f"{machine.date}, `{suite_command}` ({mode}); {ran}",
        "Each benchmark ran as its own process on a fresh PostgreSQL database (created, migrated and dropped",
        "by the script) and, where it uses Redis, a dedicated flushed Redis database.",
        "",
        "## Machine",
        "",
        *table(("", ""), machine.rows),
        "",
        f"load average at the end: {load_average()}",
        "",
    ]
    lines += (
        [f"![throughput and latency]({PLOT_NAME})", ""] if plot_note is None else [f"Plot: {plot_note}", ""]
    )
    lines += ["## Overview", "", *overview(runs)]
    for run in runs:
        lines += step_section(run, out)
    return "\n".join(lines).rstrip() + "\n"
