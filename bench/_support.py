"""The small shared runner of the benchmarks: the environment line, the results table with verdicts,
latency percentiles, child processes (started, awaited ready, stopped), CPU and RSS readings from /proc,
and a throwaway migrated PostgreSQL database."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import gc
import math
import os
import platform
import re
import secrets
import shutil
import signal
import sys
from asyncio.subprocess import DEVNULL, PIPE, STDOUT
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from app.core.collector import settle_after_start_up
from app.core.config import Settings, load_settings
from app.core.migrations import upgrade
from app.recipients.models import Recipient, Subscription

DEFAULT_ADMIN_DSN = os.environ.get("XMTP_PUSH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
# The tables' columns in their declared order: the order the benchmarks build their rows in.
RECIPIENT_COLUMNS = tuple(column.name for column in Recipient.__table__.columns)
SUBSCRIPTION_COLUMNS = tuple(column.name for column in Subscription.__table__.columns)
# What `xmtp-push api` and `xmtp-push dev` log once both servers listen.
SERVING, WORKER_READY = re.compile(r"serving http=\S*:(\d+) grpc=\S*:(\d+)"), re.compile("worker started")
# The console script of this interpreter's environment, else the first on PATH, else the module.
_SCRIPT = shutil.which("xmtp-push", path=os.path.dirname(sys.executable)) or shutil.which("xmtp-push")
XMTP_PUSH = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "workers.cli"]
ERROR_MARKERS = (" ERROR ", "Traceback", "CRITICAL", '"level": "error"', '"level":"error"')


def environment_line() -> str:
    return f"host: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"


def load_average() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def verdict(ok: bool) -> str:
    return "MEETS" if ok else "MISSES"


class Results:
    """Rows of (metric, value, target, verdict), printed as a table."""

    def __init__(self, title: str = "") -> None:
        self.title, self.rows = title, list[tuple[str, str, str, str]]()

    def add(self, name: str, display: str, target: str = "", verdict: str = "") -> None:
        self.rows.append((name, display, target, verdict))

    def print(self) -> None:
        headers = ("metric", "value", "target", "verdict")
        widths = [max(len(h), *(len(row[i]) for row in self.rows)) for i, h in enumerate(headers)]
        line = "+-" + "-+-".join("-" * w for w in widths) + "-+"
        print(f"\n== summary: {self.title} ==\n{line}")
        for row in (headers, *self.rows):
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
            if row is headers:
                print(line)
        print(line)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    values = sorted(s * 1000.0 for s in seconds)
    summary = {f"p{p}": percentile(values, p) for p in (50, 90, 99)}
    mean = sum(values) / len(values) if values else math.nan
    return summary | {"n": float(len(values)), "max": values[-1] if values else math.nan, "mean": mean}


def format_ms(summary: dict[str, float]) -> str:
    spread = "  ".join(f"{name} {summary[name]:.2f} ms" for name in ("p50", "p90", "p99", "max"))
    return f"{spread}  (mean {summary['mean']:.2f} ms, n={int(summary['n'])})"


@contextlib.contextmanager
def service_collector() -> Iterator[str]:
    """The backend's collector settings over a bare loop (the ceiling it is held to); then Python's again."""
    threshold, before = Settings.model_fields["gc_young_threshold"].default, gc.get_threshold()
    settle_after_start_up(threshold)
    try:
        yield f"start-up objects frozen, young-generation threshold {threshold:,} (as the backend)"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def run_on_fastest_loop(main: Coroutine[Any, Any, int]) -> int:
    """On uvloop, as the backend's processes run: the bare loops here are the ceiling they are held to."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (not of its children); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name, in parentheses, may hold spaces: the fields start after the last ")".
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone, or going while read
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host since boot."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    total = sum(values[:8])  # guest time is already counted in user and nice
    return float(total - values[3] - values[4]), float(total)  # less idle and iowait


def host_busy_cpus(start: tuple[float, float], end: tuple[float, float]) -> float:
    """How many CPUs the host kept busy on average between two `host_cpu()` readings."""
    return (end[0] - start[0]) / max(1.0, (end[1] - start[1]) / (os.cpu_count() or 1))


def rss_mb(pid: int) -> float:
    """Resident memory (VmRSS) of a process in MiB; NaN once it is gone."""
    with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return math.nan


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    tail: collections.deque[str]  # its latest output lines
    drainer: asyncio.Task[None]
    match: re.Match[str]  # the ready line

    @property
    def pid(self) -> int:
        return self.process.pid


def _die_with_parent() -> None:  # else a worker left by a killed run consumes the next run's Redis DB
    with contextlib.suppress(OSError, AttributeError):  # not Linux: children may outlive a killed run
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def xmtp_push_env(settings: dict[str, str]) -> dict[str, str]:
    """This environment without its XMTP_PUSH_* variables, plus `settings` (names without the prefix)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("XMTP_PUSH_")}
    return env | {f"XMTP_PUSH_{name}": value for name, value in settings.items()}


def server_env(database_url: str, **settings: str) -> dict[str, str]:
    """The database, servers on free ports of 127.0.0.1, webhooks to local plain-HTTP; then `settings`."""
    server = {"DATABASE_URL": database_url, "HTTP_HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1"}
    server |= dict.fromkeys(("HTTP_PORT", "GRPC_PORT", "METRICS_PORT"), "0")
    server |= dict.fromkeys(
        ("WEBHOOK_ENABLED", "WEBHOOK_ALLOW_INSECURE", "WEBHOOK_ALLOW_PRIVATE_ADDRESSES"), "true"
    )
    return xmtp_push_env(server | settings)


async def start_process(name: str, command: list[str], env: dict[str, str], ready: re.Pattern[str]) -> Proc:
    """Start `command` and wait (60 s at most) until a line of its stdout or stderr matches `ready`."""
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdin=DEVNULL, stdout=PIPE, stderr=STDOUT, preexec_fn=_die_with_parent
    )
    tail: collections.deque[str] = collections.deque(maxlen=200)
    found: asyncio.Future[re.Match[str]] = asyncio.get_running_loop().create_future()
    # Read the output for the process's whole life, so that a full pipe never blocks it.
    drainer = asyncio.create_task(_drain(name, process, tail, ready, found))
    try:
        return Proc(name, process, tail, drainer, await asyncio.wait_for(found, timeout=60))
    except Exception:
        print(f"{name} output tail:\n" + "\n".join(tail), file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise


async def start_xmtp_push(name: str, env: dict[str, str], ready: re.Pattern[str]) -> Proc:
    """`xmtp-push <role>`, the role `name` up to a "-" (worker-1: a worker)."""
    return await start_process(name, [*XMTP_PUSH, name.split("-")[0]], env, ready)


async def _drain(name: str, process: Any, tail: Any, ready: re.Pattern[str], found: Any) -> None:
    async for raw in process.stdout:
        tail.append(line := raw.decode(errors="replace").rstrip())
        if (matched := ready.search(line)) and not found.done():
            found.set_result(matched)
    if not found.done():
        found.set_exception(RuntimeError(f"{name} exited before it was ready"))


async def stop_process(proc: Proc) -> int | None:
    """SIGTERM, SIGKILL after 30 s; its output shown if it logged errors. Returns its exit code."""
    if proc.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.process.wait(), timeout=30)
        except TimeoutError:
            proc.process.kill()
            await proc.process.wait()
    await asyncio.gather(proc.drainer, return_exceptions=True)
    if any(marker in line for line in proc.tail for marker in ERROR_MARKERS):
        print(f"-- {proc.name} (pid {proc.pid}) logged errors; last lines:", file=sys.stderr)
        print("\n".join(list(proc.tail)[-40:]), file=sys.stderr)
    return proc.process.returncode


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _admin(dsn: str, sql: str, *, fetch: bool = False) -> Any:
    connection = await asyncpg.connect(dsn)
    try:
        return await (connection.fetchval(sql) if fetch else connection.execute(sql))
    finally:
        await connection.close()


async def server_version() -> str:
    return str(await _admin(DEFAULT_ADMIN_DSN, "SHOW server_version", fetch=True))


async def copy_tables(database_url: str, tables: Sequence[tuple[str, Sequence[str], list[Any]]]) -> None:
    """Bulk rows (table, columns, records) in one transaction with COPY, then the tables ANALYZEd."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with connection.transaction():
            for table, columns, records in tables:
                await connection.copy_records_to_table(table, records=records, columns=list(columns))
        await connection.execute("; ".join(f"ANALYZE {table}" for table, _, _ in tables))
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def bench_database(*, keep: bool = False) -> AsyncIterator[str]:
    """A fresh database migrated with Alembic: its SQLAlchemy URL. Dropped on the way out unless `keep`."""
    name = f"xmtp_push_bench_{secrets.token_hex(4)}"
    await _admin(DEFAULT_ADMIN_DSN, f'CREATE DATABASE "{name}"')
    url = (
        DEFAULT_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1) + f"/{name}"
    )
    print(f"database: created {name}")
    try:
        # upgrade() runs its own event loop (alembic env.py), so keep it off this one.
        await asyncio.to_thread(upgrade, load_settings(database_url=url))
        print(f"database: migrated {name} to head")
        yield url
    finally:
        if not keep:
            await _admin(DEFAULT_ADMIN_DSN, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        print(f"database: {'kept' if keep else 'dropped'} {name}")
