"""GET /status: a server-rendered page of the last hour's deliveries, queue depths and listener lag."""

from __future__ import annotations

import html
import time
from collections import defaultdict

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.ops.stats import Stats, collect_stats

router = APIRouter(tags=["operations"])

WIDTH, HEIGHT, PAD = 720, 220, 36
COLORS = {"apns": "#1f77b4", "fcm": "#ff7f0e", "http": "#2ca02c"}
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="15">
<title>xmtp-push status</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;color:#222;background:#fafafa}}
h1{{font-size:1.4rem}} h2{{font-size:1.1rem;margin-top:2rem}}
table{{border-collapse:collapse}} td,th{{padding:.25rem .75rem;border-bottom:1px solid #ddd;text-align:right}}
th:first-child,td:first-child{{text-align:left}} svg{{background:#fff;border:1px solid #ddd}}
.legend span{{margin-right:1rem}}
</style></head><body>
<h1>xmtp-push status</h1>
<p>Generated {generated} UTC; refreshes every 15 s.</p>
<h2>Deliveries per minute, last hour</h2>
{chart}
<p class="legend">{legend}</p>
<h2>Outcomes, last hour</h2>
{outcomes}
<h2>Queues</h2>
{queues}
<h2>Listener</h2>
<p>{listener}</p>
<h2>Recipients</h2>
{recipients}
</body></html>
"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _per_minute(stats: Stats) -> dict[str, dict[int, int]]:
    """Attempts that ended (any outcome but suppressed) per channel and minute."""
    series: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for item in stats.minutes:
        if item.outcome != "suppressed":
            series[item.channel][item.minute] += item.count
    return series


def _chart(stats: Stats) -> str:
    end = int(stats.generated) // 60 * 60
    minutes = [end - 60 * (59 - i) for i in range(60)]
    series = _per_minute(stats)
    peak = max([1, *(n for points in series.values() for n in points.values())])
    step = (WIDTH - 2 * PAD) / (len(minutes) - 1)
    lines = []
    for channel, points in sorted(series.items()):
        coords = " ".join(
            f"{PAD + i * step:.1f},{HEIGHT - PAD - points.get(m, 0) / peak * (HEIGHT - 2 * PAD):.1f}"
            for i, m in enumerate(minutes)
        )
        color = COLORS.get(channel, "#555")
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
    axes = (
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
        f'<text x="{PAD}" y="{PAD - 8}" font-size="12">{peak}/min</text>'
        f'<text x="{PAD}" y="{HEIGHT - 10}" font-size="12">-60 min</text>'
        f'<text x="{WIDTH - PAD - 24}" y="{HEIGHT - 10}" font-size="12">now</text>'
    )
    return f'<svg role="img" aria-label="deliveries per minute" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(lines)}</svg>'


def render(stats: Stats) -> str:
    outcomes = sorted({o for counts in stats.outcomes.values() for o in counts})
    outcome_rows = [[c, *(str(counts.get(o, 0)) for o in outcomes)] for c, counts in stats.outcomes.items()]
    queues = (
        _table(
            ["queue", "depth"],
            [[k, str(v)] for k, v in stats.queue_depths.items()]
            + [["retries waiting", str(stats.retries_waiting)]],
        )
        if stats.queue_depths is not None
        else "<p>No queue configured.</p>"
    )
    listener = (
        f"lag {stats.listener.lag_seconds:.1f} s, reported {time.time() - stats.listener.updated:.0f} s ago"
        if stats.listener
        else "not running or not reporting"
    )
    return PAGE.format(
        generated=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stats.generated)),
        chart=_chart(stats),
        legend="".join(f'<span style="color:{COLORS[c]}">&#9632; {c}</span>' for c in COLORS),
        outcomes=_table(["channel", *outcomes], outcome_rows)
        if outcome_rows
        else "<p>No deliveries in the last hour.</p>",
        queues=queues,
        listener=html.escape(listener),
        recipients=_table(["channel", "recipients"], [[c, str(n)] for c, n in stats.recipients.items()])
        + f"<p>{stats.subscriptions} subscriptions.</p>",
    )


@router.get("/status", response_class=HTMLResponse, summary="Status page: deliveries, queues, listener lag")
async def status(request: Request) -> HTMLResponse:
    return HTMLResponse(render(await collect_stats(request.app.state.runtime)))
