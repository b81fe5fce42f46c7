"""SVG charts of the status page: per-minute stacked bars and lines over the last hour.

Server-rendered, no script: the page refreshes itself. Colours are fixed per series so a person (and
the browser test) can tell them apart: failures are red.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

WIDTH, HEIGHT, PAD = 720, 200, 40
# Per-minute values of one series: minute (Unix seconds) -> value.
Series = Mapping[int, float]


def last_hour(generated: float) -> list[int]:
    """The sixty minutes (their starts, Unix seconds) ending with the current one."""
    end = int(generated) // 60 * 60
    return [end - 60 * (59 - i) for i in range(60)]


def _frame(label: str, peak: float, unit: str, body: str) -> str:
    axes = (
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<text x="{PAD}" y="{PAD - 8}" font-size="12">{_number(peak)}{html.escape(unit)}</text>'
        f'<text x="{PAD}" y="{HEIGHT - 10}" font-size="12">-60 min</text>'
        f'<text x="{WIDTH - PAD - 24}" y="{HEIGHT - 10}" font-size="12">now</text>'
    )
    return f'<svg role="img" aria-label="{html.escape(label)}" width="{WIDTH}" height="{HEIGHT}">{axes}{body}</svg>'


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _y(value: float, peak: float) -> float:
    return HEIGHT - PAD - value / peak * (HEIGHT - 2 * PAD)


def stacked_bars(
    label: str, minutes: Sequence[int], series: Mapping[str, Series], colors: Mapping[str, str], unit: str
) -> str:
    """One bar per minute, each series stacked on the ones before it (in `colors`' order)."""
    names = [name for name in colors if name in series]
    totals = [sum(series[name].get(m, 0) for name in names) for m in minutes]
    peak = max([1.0, *totals])
    step = (WIDTH - 2 * PAD) / len(minutes)
    rects = []
    for i, minute in enumerate(minutes):
        base = 0.0
        for name in names:
            value = series[name].get(minute, 0)
            if value <= 0:
                continue
            top, bottom = _y(base + value, peak), _y(base, peak)
            rects.append(
                f'<rect class="bar-{html.escape(name)}" x="{PAD + i * step + 1:.1f}" y="{top:.1f}" '
                f'width="{step - 2:.1f}" height="{bottom - top:.1f}" fill="{colors[name]}"/>'
            )
            base += value
    return _frame(label, peak, unit, "".join(rects))


def lines(
    label: str, minutes: Sequence[int], series: Mapping[str, Series], colors: Mapping[str, str], unit: str
) -> str:
    """One line per series; a minute with no value is drawn at zero."""
    names = [name for name in colors if name in series]
    peak = max([1.0, *(v for name in names for v in series[name].values())])
    step = (WIDTH - 2 * PAD) / (len(minutes) - 1)
    drawn = []
    for name in names:
        points = " ".join(
            f"{PAD + i * step:.1f},{_y(series[name].get(m, 0), peak):.1f}" for i, m in enumerate(minutes)
        )
        drawn.append(f'<polyline fill="none" stroke="{colors[name]}" stroke-width="2" points="{points}"/>')
    return _frame(label, peak, unit, "".join(drawn))


def legend(colors: Mapping[str, str], shown: Sequence[str]) -> str:
    return "".join(
        f'<span style="color:{colors[name]}">&#9632; {html.escape(name)}</span>'
        for name in colors
        if name in shown
    )
