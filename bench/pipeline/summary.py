"""The summary table a pipeline run ends with, which is also what `--json` writes."""

from __future__ import annotations

from bench._results import Results, verdict

RATIO_TARGET = 0.70
FANOUT_TARGET_S = 2.0
LATENCY_P99_TARGET_MS = 100.0
RSS_TARGET_MB = 200.0

__all__ = ["FANOUT_TARGET_S", "LATENCY_P99_TARGET_MS", "RATIO_TARGET", "RSS_TARGET_MB", "Summary", "verdict"]


class Summary(Results):
    """Rows of (metric, value, target, verdict), printed as a table; each row may carry its number."""

    def __init__(self) -> None:
        super().__init__(benchmark="pipeline")

    @property
    def rows(self) -> list[tuple[str, str, str, str]]:
        return [(m.name, m.display, m.target, m.verdict) for m in self.metrics]

    def print(self, title: str) -> None:
        rows = self.rows
        headers = ("metric", "value", "target", "verdict")
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        line = "+-" + "-+-".join("-" * w for w in widths) + "-+"
        print()
        print(f"== summary: {title} ==")
        print(line)
        print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
        print(line)
        for row in rows:
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        print(line)
