"""The benchmarks `python -m bench` runs, in order, and running one of them as its own process.

Each step is one `python -m bench.<script> ...` command, run from the repository root with `--json` added
(so its numbers come back machine-readable), its whole output kept in a log file. Every script creates
and drops its own PostgreSQL database, so each step starts on a fresh one.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._results import read

ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_S = 30.0


@dataclass(frozen=True)
class Step:
    name: str
    module: str
    title: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    default: bool = True  # run unless --only names other steps

    def argv(self, quick: bool) -> list[str]:
        return ["-m", self.module, *(self.quick if quick else self.full)]


# Quick pipeline runs also give up sooner when deliveries stop coming (--stall: 20 s by default).
_QUICK_THROUGHPUT = ("--subscribers", "300", "--topics", "10", "--envelopes", "100", "--stall", "10")

STEPS: tuple[Step, ...] = (
    Step(
        "registration",
        "bench.registration",
        "Register (open loop) and UpdateSubscriptions (1000 adds) over gRPC",
        (),
        ("--duration", "3", "--warmup", "1", "--update-calls", "30", "--update-warmup-calls", "5"),
    ),
    Step(
        "subscriber_plan",
        "bench.subscriber_plan",
        "Fan-out page query: plan and speed over stored subscriptions",
        (),
        (
            *("--subscriptions", "100000", "--recipients", "20000", "--active-recipients", "5000"),
            *("--topics", "5000", "--hot-subscribers", "10000", "--repeats", "5"),
        ),
    ),
    Step(
        "pipeline-memory",
        "bench.pipeline",
        "Webhook hints end to end vs a bare aiohttp loop: memory mode",
        ("--mode", "memory", "--scenario", "throughput"),
        ("--mode", "memory", "--scenario", "throughput", *_QUICK_THROUGHPUT),
    ),
    Step(
        "pipeline-redis-1w",
        "bench.pipeline",
        "Webhook hints end to end vs a bare aiohttp loop: redis mode, 1 worker",
        ("--mode", "redis", "--workers", "1", "--scenario", "throughput"),
        ("--mode", "redis", "--workers", "1", "--scenario", "throughput", *_QUICK_THROUGHPUT),
    ),
    Step(
        "pipeline-redis-2w",
        "bench.pipeline",
        "Webhook hints end to end vs a bare aiohttp loop: redis mode, 2 workers",
        ("--mode", "redis", "--workers", "2", "--scenario", "throughput"),
        ("--mode", "redis", "--workers", "2", "--scenario", "throughput", *_QUICK_THROUGHPUT),
    ),
    Step(
        "fanout",
        "bench.pipeline",
        "One envelope to a topic with many subscribers: redis mode, 1 worker",
        ("--mode", "redis", "--scenario", "fanout", "--subscribers", "100000"),
        ("--mode", "redis", "--scenario", "fanout", "--subscribers", "10000", "--stall", "10"),
    ),
    Step(
        "fanout-2w",
        "bench.pipeline",
        "One envelope to a topic with many subscribers: redis mode, 2 workers",
        ("--mode", "redis", "--workers", "2", "--scenario", "fanout", "--subscribers", "100000"),
        (
            "--mode",
            "redis",
            "--workers",
            "2",
            "--scenario",
            "fanout",
            "--subscribers",
            "10000",
            "--stall",
            "10",
        ),
    ),
    Step(
        "latency",
        "bench.pipeline",
        "Ingest-to-receipt latency at a fixed rate, open loop: redis mode, 1 worker",
        ("--mode", "redis", "--scenario", "latency", "--rate", "1000", "--duration", "30"),
        (
            *("--mode", "redis", "--scenario", "latency", "--rate", "1000", "--duration", "10"),
            *("--subscribers", "200", "--topics", "100", "--stall", "10"),
        ),
    ),
    Step(
        "channels-apns",
        "bench.channels",
        "APNs hints through the pipeline vs bare aioapns, same fake server",
        ("--channel", "apns"),
        ("--channel", "apns", "--hints", "2000", "--recipients", "100"),
    ),
    Step(
        "channels-fcm",
        "bench.channels",
        "FCM hints through the pipeline vs bare firebase-admin send_each_async, 16 in flight",
        ("--channel", "fcm", "--concurrency", "16", "--env", "DELIVERY_CONCURRENCY=16"),
        (
            *("--channel", "fcm", "--concurrency", "16", "--env", "DELIVERY_CONCURRENCY=16"),
            *("--hints", "1000", "--recipients", "100"),
        ),
    ),
    Step(
        "marmot",
        "bench.marmot",
        "Marmot triggers through a local relay to the APNs and FCM fakes vs a bare unwrap-and-decrypt loop",
        (),
        ("--triggers", "300"),
    ),
    Step(
        "matrix",
        "bench.matrix",
        "Matrix gateway one-device notify vs a bare aioapns loop, same fake APNs, 64 in flight; memory soak",
        (),
        ("--requests", "3000", "--duration", "10"),
    ),
    Step(
        "listener_decode",
        "bench.listener_decode",
        "Listener decode, dedupe and enqueue on one core (no database; only with --only)",
        (),
        ("--envelopes", "20000", "--repeat", "1"),
        default=False,
    ),
)


def select(only: str | None) -> list[Step]:
    """The default steps, or those named in a comma-separated `--only` list (in the suite's order)."""
    if not only:
        return [s for s in STEPS if s.default]
    names = {n.strip() for n in only.split(",") if n.strip()}
    known = {s.name for s in STEPS}
    unknown = sorted(names - known)
    if unknown:
        raise SystemExit(
            f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
        )
    return [s for s in STEPS if s.name in names]


def interpreter() -> str:
    """This interpreter, relative to the repository root when inside it (as a reader would type it)."""
    path = Path(sys.executable)
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def command_line(step: Step, quick: bool) -> str:
    return shlex.join([interpreter(), *step.argv(quick)])


@dataclass
class StepRun:
    step: Step
    command: str
    seconds: float
    exit_code: int
    log: Path
    results: dict[str, Any] | None  # the script's --json document; None when it wrote none
    finished: str = ""  # when it ended, UTC ("" when not known)

    @property
    def ok(self) -> bool:
        return self.results is not None


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _wait(process: subprocess.Popen[bytes], on_tick: Callable[[float], None]) -> int:
    """Wait for the step, reporting every HEARTBEAT_S; on Ctrl-C (which the step gets too) let it clean up."""
    started = time.monotonic()
    while True:
        try:
            return process.wait(timeout=HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            on_tick(time.monotonic() - started)
        except KeyboardInterrupt:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise


def run_step(step: Step, quick: bool, data_dir: Path, log_dir: Path, label: str) -> StepRun:
    json_path = data_dir / f"{step.name}.json"
    log_path = log_dir / f"{step.name}.log"
    json_path.unlink(missing_ok=True)
    command = command_line(step, quick)
    progress(f"{label} {step.name}: {command}")
    argv: Sequence[str] = [sys.executable, *step.argv(quick), "--json", str(json_path)]
    started = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(f"$ {command}\n".encode())
        log.flush()
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        code = _wait(process, lambda s: progress(f"{label} {step.name}: running, {s:.0f} s"))
    seconds = time.monotonic() - started
    results = read(str(json_path)) if json_path.exists() else None
    run = StepRun(
        step, command, seconds, code, log_path, results, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    )
    _run_path(data_dir, step).write_text(
        json.dumps({"command": command, "seconds": seconds, "exit_code": code, "finished": run.finished})
    )
    return run


def _run_path(data_dir: Path, step: Step) -> Path:
    return data_dir / f"{step.name}.run.json"


def earlier_run(step: Step, data_dir: Path, log_dir: Path) -> StepRun | None:
    """The step's run kept in the report folder by an earlier `python -m bench`, if its numbers are
    there: how a report is updated for the benchmarks run now and keeps the others."""
    json_path, log_path = data_dir / f"{step.name}.json", log_dir / f"{step.name}.log"
    if not json_path.exists():
        return None
    meta: dict[str, Any] = {"command": "", "seconds": math.nan, "exit_code": 0, "finished": ""}
    if _run_path(data_dir, step).exists():
        meta.update(json.loads(_run_path(data_dir, step).read_text()))
    elif log_path.exists():  # older folders: the log's first line is the command
        with open(log_path) as log:
            meta["command"] = log.readline().removeprefix("$ ").strip()
    return StepRun(
        step,
        meta["command"],
        meta["seconds"],
        meta["exit_code"],
        log_path,
        read(str(json_path)),
        meta["finished"],
    )


def with_earlier_runs(runs: Sequence[StepRun], data_dir: Path, log_dir: Path) -> list[StepRun]:
    """Every default step (and each step run now) in the suite's order: the runs of now, and for the
    others their earlier run where the folder holds one."""
    now = {run.step.name: run for run in runs}
    merged = []
    for step in STEPS:
        run = now.get(step.name) or (earlier_run(step, data_dir, log_dir) if step.default else None)
        if run is not None:
            merged.append(run)
    return merged


def verdict_counts(run: StepRun) -> str:
    if run.results is None:
        return f"FAILED (exit {run.exit_code}, no results)"
    verdicts = [m["verdict"] for m in run.results["metrics"]]
    meets, misses = verdicts.count("MEETS"), verdicts.count("MISSES")
    return f"{meets} MEETS, {misses} MISSES" + (f" (exit {run.exit_code})" if run.exit_code else "")
