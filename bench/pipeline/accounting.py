"""CPU accounting of the benchmark's processes over one measured window."""

from __future__ import annotations

import math
import os
import time

from bench._proc import host_busy_cpus, host_cpu, process_cpu_seconds


class CpuWindow:
    """CPU used from construction to `stop()` by the named processes, this one ("bench") and the host."""

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
        self.host_busy = host_busy_cpus(self.start_host, host_cpu())
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
