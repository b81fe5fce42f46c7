"""CPU and memory accounting of the benchmark's processes, from /proc."""

from __future__ import annotations

import math
import os
import time


def process_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu() -> tuple[float, float]:
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return float(total - idle), float(total)


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except FileNotFoundError:
        pass
    return math.nan


class CpuWindow:
    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {**procs, "bench": os.getpid()}
        self.start_wall = time.monotonic()
        self.start = {name: process_cpu_seconds(pid) for name, pid in self.procs.items()}
        self.start_host = host_cpu()
        self.result: dict[str, float] = {}

    def stop(self) -> CpuWindow:
        wall = time.monotonic() - self.start_wall
        self.wall = wall
        self.seconds = {name: process_cpu_seconds(pid) - self.start[name] for name, pid in self.procs.items()}
        self.result = {name: used / wall for name, used in self.seconds.items()}
        busy, total = host_cpu()
        self.host_busy = (
            (busy - self.start_host[0]) / max(1.0, total - self.start_host[1]) * (os.cpu_count() or 1)
        )
        return self

    def describe(self) -> str:
        parts = [f"{name} {share * 100:.0f}%" for name, share in self.result.items()]
        rest = self.host_busy - sum(v for v in self.result.values() if not math.isnan(v))
        return (
            "cpu (% of one core): "
            + ", ".join(parts)
            + f"; redis+postgres+other {max(0.0, rest) * 100:.0f}%; host {self.host_busy * 100:.0f}% of "
            f"{(os.cpu_count() or 1) * 100}%"
        )
