"""GET /status: a server-rendered page of the last hour: deliveries and failures apart, attempt latency,
the backlog, each channel's health, the listener, version and uptime."""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Iterable

import psutil
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app import __version__
from app.api.charts import last_hour, legend, lines, stacked_bars
from app.core.channels import Channel
from app.delivery.registry import CHANNELS
from app.ops.stats import CHANNEL_LABELS, FAILURES, Stats, collect_stats, listener_summary, node_go_summary
from app.queue.activity import MinuteCount
from app.queue.backlog import RETRIES
from app.queue.base import ENVELOPES, delivery_stream

router = APIRouter(tags=["operations"])

COLORS: dict[str, str] = {channel: CHANNELS[channel].color for channel in CHANNEL_LABELS}
# Failures in red (failed: retries ran out; rejected: refused for good); a gone target (dead) and a token
# of another app (mismatch) apart from them.
FAILURE_COLORS = {"failed": "#d62728", "rejected": "#8b0000", "mismatch": "#9467bd", "dead": "#7f7f7f"}
QUEUE_COLORS = {
    ENVELOPES: "#8c564b",
    **{delivery_stream(channel): COLORS[channel] for channel in CHANNEL_LABELS},
    RETRIES: "#e377c2",
}
# A failure share above this marks a channel failing (the alert rule's threshold).
FAILING_RATIO = 0.1
STARTED = psutil.Process().create_time()
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="15">
<title>xmtp-push status</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;color:#222;background:#fafafa}}
h1{{font-size:1.4rem}} h2{{font-size:1.1rem;margin-top:1.6rem}}
table{{border-collapse:collapse}} td,th{{padding:.25rem .75rem;border-bottom:1px solid #ddd;text-align:right}}
th:first-child,td:first-child{{text-align:left}} svg{{background:#fff;border:1px solid #ddd}}
.legend span{{margin-right:1rem}} .ok{{color:#2ca02c}} .bad{{color:#d62728;font-weight:bold}} .off{{color:#888}}
.warn{{color:#b8860b}}
</style></head><body>
<h1>xmtp-push status</h1>
<p>Version {version}, up {uptime}. Generated {generated} UTC; refreshes every 15 s.</p>
<h2>Dependencies</h2>
{dependencies}
<h2>Channels</h2>
{channels}
<h2>Listener</h2>
<p id="listener" class="{listener_class}">xmtpd: {listener}</p>
<p id="node-go-listener" class="{node_go_class}">node-go: {node_go}</p>
<h2>Delivered per minute, last hour</h2>
{delivered}
<p class="legend">{delivered_legend}</p>
<h2>Failures per minute, last hour</h2>
{failures}
<p class="legend">{failures_legend}</p>
<h2>Attempt latency, last hour (mean per minute)</h2>
{latency}
<p class="legend">{latency_legend}</p>
<h2>Backlog, last hour</h2>
{backlog}
<p class="legend">{backlog_legend}</p>
<h2>Outcomes, last hour</h2>
{outcomes}
<h2>Queues</h2>
{queues}
<h2>Recipients</h2>
{recipients}
</body></html>
"""


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _per_minute(items: Iterable[MinuteCount], key: str) -> dict[str, dict[int, float]]:
    """Per-minute values by `key` ("channel" or "outcome")."""
    series: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for item in items:
        series[getattr(item, key)][item.minute] += item.count
    return series


def _signal(stats: Stats, name: str) -> dict[str, dict[int, float]]:
    return _per_minute((m for m in stats.series if m.outcome == name), "subject")


def _latency(stats: Stats) -> dict[str, dict[int, float]]:
    attempts, total_ms = _signal(stats, "attempts"), _signal(stats, "attempt_ms")
    return {
        channel: {m: total_ms[channel].get(m, 0) / n for m, n in counts.items() if n}
        for channel, counts in attempts.items()
    }


def _health(channel: Channel, stats: Stats, configured: set[Channel]) -> tuple[str, str]:
    """A channel's health in words, and its class on the page."""
    if channel not in configured:
        return "not configured", "off"
    refused = stats.credentials_refused.get(channel, 0)
    if refused:
        return f"credentials refused ({refused} in the last hour)", "bad"
    counts = stats.outcomes.get(channel, {})
    ended = sum(n for o, n in counts.items() if o != "suppressed")
    failed = sum(counts.get(o, 0) for o in ("failed", "rejected"))
    if ended and failed / ended > FAILING_RATIO:
        return f"failing ({failed} of {ended} failed or rejected)", "bad"
    return "ok", "ok"


def _channels(stats: Stats, configured: set[Channel]) -> str:
    rows = []
    for channel in CHANNEL_LABELS:
        health, css = _health(channel, stats, configured)
        counts = stats.outcomes.get(channel, {})
        failures = sum(counts.get(o, 0) for o in FAILURES)
        rows.append(
            f'<tr><td>{channel}</td><td class="{css}">{html.escape(health)}</td>'
            f"<td>{counts.get('delivered', 0)}</td><td>{failures}</td></tr>"
        )
    head = "<tr><th>channel</th><th>health</th><th>delivered, last hour</th><th>failures, last hour</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _duration(seconds: float) -> str:
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h {minutes} min" if days else f"{hours} h {minutes} min"


def _dependencies(stats: Stats) -> str:
    classes = {"ok": "ok", "unavailable": "bad"}
    rows = [
        f'<tr><td>{name}</td><td class="{classes.get(state, "off")}">{html.escape(state)}</td></tr>'
        for name, state in stats.dependencies.items()
    ]
    return f"<table><tr><th>service</th><th>state</th></tr>{''.join(rows)}</table>"


def _queues(stats: Stats) -> str:
    if stats.queue_depths is None:
        if stats.dependencies.get("redis") == "unavailable":
            return "<p>Unknown: Redis does not answer.</p>"
        return "<p>No queue configured.</p>"
    rows = [[k, str(v)] for k, v in stats.queue_depths.items()]
    return _table(["queue", "depth"], [*rows, ["retries waiting", str(stats.retries_waiting)]])


def _recipients(stats: Stats) -> str:
    if stats.recipients is None:
        return "<p>Unknown: the database does not answer.</p>"
    rows = [[c, str(n)] for c, n in stats.recipients.items()]
    return _table(["channel", "recipients"], rows) + f"<p>{stats.subscriptions} subscriptions.</p>"


def _outcomes(stats: Stats) -> str:
    names = sorted({o for counts in stats.outcomes.values() for o in counts})
    rows = [[c, *(str(counts.get(o, 0)) for o in names)] for c, counts in stats.outcomes.items()]
    return _table(["channel", *names], rows) if rows else "<p>No deliveries in the last hour.</p>"


def render(stats: Stats, configured: set[Channel]) -> str:
    minutes = last_hour(stats.generated)
    delivered = _per_minute((m for m in stats.minutes if m.outcome == "delivered"), "subject")
    failures = _per_minute((m for m in stats.minutes if m.outcome in FAILURES), "outcome")
    latency, backlog = _latency(stats), _signal(stats, "backlog")
    listener, listener_class = listener_summary(stats.listener, stats.generated)
    node_go, node_go_class = node_go_summary(stats.node_go_listener, stats.generated)
    return PAGE.format(
        version=html.escape(__version__),
        uptime=_duration(time.time() - STARTED),
        generated=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stats.generated)),
        dependencies=_dependencies(stats),
        channels=_channels(stats, configured),
        listener=html.escape(listener),
        listener_class=listener_class,
        node_go=html.escape(node_go),
        node_go_class=node_go_class,
        delivered=stacked_bars("delivered per minute", minutes, delivered, COLORS, "/min"),
        delivered_legend=legend(COLORS, list(COLORS)),
        failures=stacked_bars("failures per minute", minutes, failures, FAILURE_COLORS, "/min"),
        failures_legend=legend(FAILURE_COLORS, list(FAILURE_COLORS)),
        latency=lines("mean attempt latency", minutes, latency, COLORS, " ms"),
        latency_legend=legend(COLORS, list(latency)),
        backlog=lines("backlog", minutes, backlog, QUEUE_COLORS, ""),
        backlog_legend=legend(QUEUE_COLORS, list(backlog)),
        outcomes=_outcomes(stats),
        queues=_queues(stats),
        recipients=_recipients(stats),
    )


@router.get(
    "/status",
    response_class=HTMLResponse,
    summary="Status page: deliveries and failures, latency, backlog, channels, listener",
)
async def status(request: Request) -> HTMLResponse:
    runtime = request.app.state.runtime
    configured = {provider.channel for provider in runtime.providers}
    return HTMLResponse(render(await collect_stats(runtime, unknown_while_down=True), configured))
