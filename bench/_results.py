"""Machine-readable results of one benchmark run, written with `--json PATH` and read by `python -m bench`.

The document a script writes:

    {"benchmark": "pipeline", "title": "...",
     "metrics": [{"name": ..., "value": 1234.5 or null, "unit": "deliveries/s", "display": "1,235",
                  "target": ">= 70 %", "verdict": "MEETS" | "MISSES" | "", "key": "ours_per_s"}, ...],
     "series": {"windows": [{"t_s": 0.0, "n": 512, "deliveries_per_s": 1024.0, "p50_ms": ..., ...}]},
     "info": {...}}

`display`, `target` and `verdict` are what the script prints in its own summary; `value` is the same
number unrounded (null when the metric is not a number), `key` a stable name for the report's plot.
NaN is written as null.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

MEETS, MISSES = "MEETS", "MISSES"


def verdict(ok: bool) -> str:
    return MEETS if ok else MISSES


@dataclass
class Metric:
    name: str
    display: str
    target: str = ""
    verdict: str = ""
    value: float | None = None
    unit: str = ""
    key: str = ""


def _clean(value: Any) -> Any:
    """NaN and infinities as None (JSON has neither), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


@dataclass
class Results:
    benchmark: str
    title: str = ""
    metrics: list[Metric] = field(default_factory=list)
    series: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        display: str,
        target: str = "",
        verdict: str = "",
        *,
        value: float | None = None,
        unit: str = "",
        key: str = "",
    ) -> None:
        self.metrics.append(Metric(name, display, target, verdict, value, unit, key))

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = _clean(asdict(self))
        return document

    def write(self, path: str | None) -> None:
        """Write the JSON document to `path` (atomically); nothing when `path` is None."""
        if not path:
            return
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".results-", suffix=".json")
        with os.fdopen(handle, "w") as file:
            json.dump(self.to_dict(), file, indent=1, allow_nan=False)
        os.replace(temporary, path)


def read(path: str) -> dict[str, Any]:
    with open(path) as file:
        document: dict[str, Any] = json.load(file)
    return document
