"""The report's figure: deliveries/s and p50/p99 latency over the latency run, and ours vs the bare loops."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.pipeline.summary import LATENCY_P99_TARGET_MS, RATIO_TARGET
from bench.suite import StepRun

LATENCY_STEP = "latency"
# Bars of the right-hand panel: step name -> label.
BARS = {
    "pipeline-memory": "webhook\nmemory",
    "pipeline-redis-1w": "webhook\nredis, 1 worker",
    "pipeline-redis-2w": "webhook\nredis, 2 workers",
    "channels-apns": "APNs\nredis",
    "channels-fcm": "FCM\nredis",
}


def metric(results: dict[str, Any] | None, key: str) -> float | None:
    for m in (results or {}).get("metrics", ()):
        if m.get("key") == key and m.get("value") is not None:
            return float(m["value"])
    return None


def _finite(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def plot_rate(axis: Any, results: dict[str, Any]) -> None:
    windows = results["series"].get("windows", [])
    width = results["info"].get("series_window_s") or 1.0
    times = [w["t_s"] for w in windows]
    axis.step(times, [w["deliveries_per_s"] for w in windows], where="post", label="received", color="C0")
    offered = results["info"].get("offered_per_s")
    if offered:
        axis.axhline(offered, color="grey", linestyle="--", linewidth=1, label=f"offered {offered:g}/s")
    axis.set_ylabel("deliveries/s")
    axis.set_title(f"latency run: deliveries received per {width:g} s window")
    axis.set_ylim(bottom=0)
    axis.legend(loc="lower right", fontsize=8)
    axis.grid(alpha=0.3)


def plot_latency(axis: Any, results: dict[str, Any]) -> None:
    windows = results["series"].get("windows", [])
    times = [w["t_s"] + (results["info"].get("series_window_s") or 0) / 2 for w in windows]
    p50, p99 = _finite([w["p50_ms"] for w in windows]), _finite([w["p99_ms"] for w in windows])
    axis.plot(times, p50, marker=".", label="p50", color="C0")
    axis.plot(times, p99, marker=".", label="p99", color="C3")
    axis.axhline(LATENCY_P99_TARGET_MS, color="C3", linestyle="--", linewidth=1, label="p99 target")
    finite = [v for v in p50 + p99 if not math.isnan(v) and v > 0]
    if finite and max(finite) / min(finite) > 50:
        axis.set_yscale("log")
    else:
        axis.set_ylim(bottom=0)
    axis.set_xlabel("seconds since the first ingest request")
    axis.set_ylabel("ingest -> receipt, ms")
    axis.set_title("latency run: ingest-to-receipt latency per window")
    axis.legend(loc="upper left", fontsize=8)
    axis.grid(alpha=0.3)


def plot_bars(axis: Any, runs: dict[str, StepRun]) -> None:
    labels, ours, bare = [], [], []
    for name, label in BARS.items():
        run = runs.get(name)
        values = (
            (metric(run.results, "ours_per_s"), metric(run.results, "bare_per_s")) if run else (None, None)
        )
        if values[0] is None and values[1] is None:
            continue
        labels.append(label)
        ours.append(values[0] or 0.0)
        bare.append(values[1] or 0.0)
    if not labels:
        _empty(axis, "no throughput or channel run in this report")
        return
    positions = range(len(labels))
    axis.bar([p - 0.2 for p in positions], ours, width=0.4, label="ours (pipeline)", color="C0")
    axis.bar([p + 0.2 for p in positions], bare, width=0.4, label="bare loop", color="C7")
    for p, (o, b) in enumerate(zip(ours, bare, strict=True)):
        if b:
            axis.hlines(b * RATIO_TARGET, p - 0.4, p, colors="C3", linestyles="--", linewidth=1)
            axis.annotate(f"{o / b * 100:.0f} %", (p - 0.2, o), ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(positions), labels, fontsize=8)
    half, center = max(len(labels), 3) / 2, (len(labels) - 1) / 2  # bars as wide with few groups
    axis.set_xlim(center - half, center + half)
    axis.set_ylabel("hints delivered per second")
    axis.set_title("ours vs bare loop (red dashes: 70 % of bare)")
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)


def _empty(axis: Any, text: str) -> None:
    axis.text(0.5, 0.5, text, ha="center", va="center", transform=axis.transAxes, color="grey")
    axis.set_xticks([])
    axis.set_yticks([])


def draw(runs: Sequence[StepRun], path: Path, title: str) -> None:
    """Write the figure to `path` (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    by_name = {r.step.name: r for r in runs}
    figure = pyplot.figure(figsize=(13, 7.5), layout="constrained")
    grid = figure.add_gridspec(2, 2, width_ratios=(1.4, 1))
    rate_axis = figure.add_subplot(grid[0, 0])
    latency_axis = figure.add_subplot(grid[1, 0], sharex=rate_axis)
    latency = by_name.get(LATENCY_STEP)
    if latency is not None and latency.results and latency.results["series"].get("windows"):
        plot_rate(rate_axis, latency.results)
        plot_latency(latency_axis, latency.results)
    else:
        _empty(rate_axis, "no latency run in this report")
        _empty(latency_axis, "no latency run in this report")
    plot_bars(figure.add_subplot(grid[:, 1]), by_name)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
