"""What /proc says about the benchmark's processes and the host: CPU time, resident memory, load."""

from __future__ import annotations

import math
import os


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (not of its children); NaN once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name, in parentheses, may hold spaces: the fields start after the last ")".
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone, or going while read
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host since boot, from /proc/stat."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user and nice
    return float(total - idle), float(total)


def host_busy_cpus(start: tuple[float, float], end: tuple[float, float]) -> float:
    """How many CPUs the whole host kept busy, on average, between two `host_cpu()` readings."""
    busy = end[0] - start[0]
    ticks_per_cpu = (end[1] - start[1]) / (os.cpu_count() or 1)
    return busy / max(1.0, ticks_per_cpu)


def rss_mb(pid: int) -> float:
    """Resident memory (VmRSS) of a process in MiB; NaN once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except FileNotFoundError:
        pass
    return math.nan


def load_average() -> str:
    """The host's 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])
