"""GET /status in a real browser: headless Chromium loads the page the API serves after scripted runs,
takes a screenshot that must show the page (and its charts), and dumps the DOM it rendered. One run
delivers on two channels (gone targets among them); another is a failure burst, which must show in
red: failure bars in the failures chart, and the channels' health."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psutil
import pytest

from app import __version__
from app.api.status import COLORS, FAILURE_COLORS, render
from app.ops.stats import Stats, collect_stats
from app.queue.activity import LISTENER_KEYS, NODE_GO, ListenerState, RedisActivityLog
from app.queue.redis_link import RedisLink
from fakes.fake_apns import FakeApns
from fakes.keys import apns_key_pem
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Receiver
from tests.support import ops as ops_support
from tests.support import pipeline as pipeline_support
from tests.support.ops import Image, read_png, register, required_tool, run_child, scripted_run
from tests.support.pipeline import Pipeline, envelope, group_topic, running_pipeline

redis_url = pipeline_support.redis_url
redis_postgresql_stack = pipeline_support.redis_postgresql_stack

BROWSER_SECONDS = 60.0
WIDTH, HEIGHT = 1000, 1800
BACKGROUND = (0xFA, 0xFA, 0xFA)


def uptime_minutes() -> float:
    return (time.time() - psutil.Process().create_time()) / 60


def chromium_args(chromium: str, profile: Path, *extra: str) -> list[str]:
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{HEIGHT}",
        *extra,
    ]


def rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def near(pixel: tuple[int, int, int], color: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, color, strict=True))


def longest_run(image: Image, color: tuple[int, int, int]) -> tuple[int, int, int]:
    """(length, row, first column) of the longest horizontal run of pixels near `color`: a chart
    line, not a glyph."""
    best = (0, 0, 0)
    for row in range(image.height):
        run = 0
        for column, pixel in enumerate(image.pixels[row * image.width : (row + 1) * image.width]):
            run = run + 1 if near(pixel, color) else 0
            if run > best[0]:
                best = (run, row, column - run + 1)
    return best


def tallest_column(image: Image, color: tuple[int, int, int]) -> int:
    """The longest vertical run of pixels near `color`: a bar, not a glyph (text is 16 px at most)."""
    best = 0
    for column in range(image.width):
        run = 0
        for row in range(image.height):
            run = run + 1 if near(image.pixels[row * image.width + column], color, 24) else 0
            best = max(best, run)
    return best


def svg(html: str, label: str) -> str:
    found = re.search(rf'<svg role="img" aria-label="{label}".*?</svg>', html)
    assert found, f"no {label} chart"
    return found.group()


def bars(chart: str) -> dict[str, str]:
    """Series name -> fill of the bars drawn for it."""
    return dict(re.findall(r'<rect class="bar-([a-z]+)" [^>]*fill="(#[0-9a-f]{6})"', chart))


async def browse(url: str, folder: Path) -> tuple[str, Image]:
    """The DOM Chromium renders for `url`, and its screenshot."""
    chromium = required_tool("chromium", "chromium")
    screenshot = folder / "status.png"
    # The browser runs beside this event loop, which keeps serving the page.
    shot, dom = await asyncio.gather(
        run_child(
            chromium_args(chromium, folder / "profile-shot", f"--screenshot={screenshot}", url),
            ops_support.child_env(),
            BROWSER_SECONDS,
        ),
        run_child(
            chromium_args(chromium, folder / "profile-dom", "--dump-dom", url),
            ops_support.child_env(),
            BROWSER_SECONDS,
        ),
    )
    assert shot.returncode == 0, shot
    assert dom.returncode == 0, dom
    assert screenshot.is_file(), shot
    image = read_png(screenshot.read_bytes())
    assert (image.width, image.height) == (WIDTH, HEIGHT)
    colors = image.colors()
    assert len(colors) >= 50, f"only {len(colors)} colours: a blank page?"
    drawn = sum(1 for p in image.pixels if p != BACKGROUND)
    assert drawn > 0.02 * len(image.pixels), f"only {drawn} pixels differ from the background"
    return dom.stdout, image


def pipeline_with_apns(
    stack: pipeline_support.Stack, apns: FakeApns, tls: TlsFiles
) -> AbstractAsyncContextManager[Pipeline]:
    """The pipeline with the local APNs configured beside the webhooks."""
    apns.reset()
    return running_pipeline(
        stack, apns_key=apns_key_pem(), apns_endpoint=apns.endpoint, apns_ca_file=tls.ca_file
    )


@pytest.mark.browser
async def test_status_page_in_headless_chromium(
    redis_postgresql_stack: pipeline_support.Stack,
    receiver: Receiver,
    apns_server: FakeApns,
    tls: TlsFiles,
    tmp_path: Path,
) -> None:
    async with pipeline_with_apns(redis_postgresql_stack, apns_server, tls) as pipe:
        run = await scripted_run(pipe, receiver, apns_server)
        configured = {p.channel for p in pipe.runtime.providers}
        before = uptime_minutes()
        html, image = await browse(f"{pipe.http.base_url}/status", tmp_path)
        after = uptime_minutes()

    # What the page shows.
    assert "<h1>xmtp-push status</h1>" in html, html[:2000]
    # Uptime of the serving process (this one): whole minutes since it started, as of a moment while
    # the browser loaded the page (which may take a while on a busy machine).
    up = re.search(rf"Version {re.escape(__version__)}, up (\d+) h (\d+) min\.", html)
    assert up, html[:2000]
    assert int(before) <= int(up.group(1)) * 60 + int(up.group(2)) <= after, (up.group(), before, after)
    for channel, counts in run.outcomes.items():
        cells = "".join(f"<td>{counts.get(o, 0)}</td>" for o in ("dead", "delivered"))
        assert f"<tr><td>{channel}</td>{cells}</tr>" in html, channel
    for queue in ("envelopes", "deliveries.apns", "deliveries.fcm", "deliveries.http", "retries waiting"):
        assert f"<tr><td>{queue}</td><td>0</td></tr>" in html, queue
    for channel, count in run.recipients.items():
        assert f"<tr><td>{channel}</td><td>{count}</td></tr>" in html, channel
    assert f"<p>{run.subscriptions} subscriptions.</p>" in html
    # Channels: delivered and gone targets are healthy; a channel without settings says so.
    for channel in ("apns", "fcm", "http"):
        health = '<td class="ok">ok</td>' if channel in configured else '<td class="off">not configured</td>'
        delivered = run.outcomes.get(channel, {}).get("delivered", 0)
        failures = run.outcomes.get(channel, {}).get("dead", 0)
        assert f"<tr><td>{channel}</td>{health}<td>{delivered}</td><td>{failures}</td></tr>" in html, channel
    assert 'class="off">xmtpd: not configured: no listener has reported' in html
    # Deliveries apart from failures: the gone targets are failures' bars (grey), never red.
    assert bars(svg(html, "delivered per minute")) == {c: COLORS[c] for c in ("apns", "http")}
    assert bars(svg(html, "failures per minute")) == {"dead": FAILURE_COLORS["dead"]}
    # Latency: a line per channel that attempted, one point per minute of the last hour.
    polylines = re.findall(
        r'stroke="(#[0-9a-f]{6})" stroke-width="2" points="([^"]+)"', svg(html, "mean attempt latency")
    )
    assert sorted(color for color, _ in polylines) == sorted([COLORS["apns"], COLORS["http"]]), polylines
    assert all(len(points.split()) == 60 for _, points in polylines)
    # Backlog: the workers' samples, a line per queue.
    assert len(re.findall("<polyline", svg(html, "backlog"))) == 5

    # What the browser drew: the bars, and nothing red taller than the legend's swatch.
    assert tallest_column(image, rgb(COLORS["http"])) >= 20
    assert tallest_column(image, rgb(FAILURE_COLORS["failed"])) < 20


async def failure_burst(pipe: Pipeline, receiver: Receiver, apns: FakeApns) -> dict[str, dict[str, int]]:
    """Webhooks failing (500, until the retries run out) and refusing (400), one delivered, and an
    APNs token whose answer refuses the credentials (403); one envelope for them all."""
    topic = group_topic()
    answers = [500, 500, 500, 400, 400, 200]
    hooks = [receiver.endpoint([status]) for status in answers]
    for hook in hooks:
        await register(pipe.stub, "http", hook.url, hook.key, [topic])
    await register(pipe.stub, "apns", f"forbidden.{secrets.token_hex(8)}", topics=[topic])
    await pipe.ingest_ok([envelope(topic, 42)])
    expected = {"apns": {"rejected": 1}, "http": {"delivered": 1, "failed": 3, "rejected": 2}}
    deadline = time.monotonic() + 30
    while (await collect_stats(pipe.runtime)).outcomes != expected:
        pipe.check_workers()
        assert time.monotonic() < deadline, (await collect_stats(pipe.runtime)).outcomes
        await asyncio.sleep(0.05)
    await pipe.settled(receiver)
    return expected


@pytest.mark.browser
async def test_a_failure_burst_shows_in_red(
    redis_postgresql_stack: pipeline_support.Stack,
    receiver: Receiver,
    apns_server: FakeApns,
    tls: TlsFiles,
    tmp_path: Path,
) -> None:
    async with pipeline_with_apns(redis_postgresql_stack, apns_server, tls) as pipe:
        await failure_burst(pipe, receiver, apns_server)
        html, image = await browse(f"{pipe.http.base_url}/status", tmp_path)

    assert (
        '<tr><td>http</td><td class="bad">failing (5 of 6 failed or rejected)</td><td>1</td><td>5</td></tr>'
        in html
    )
    assert (
        '<tr><td>apns</td><td class="bad">credentials refused (1 in the last hour)</td><td>0</td><td>1</td></tr>'
        in html
    )
    failures = bars(svg(html, "failures per minute"))
    assert failures == {"failed": FAILURE_COLORS["failed"], "rejected": FAILURE_COLORS["rejected"]}
    assert FAILURE_COLORS["failed"] == "#d62728"  # red
    assert bars(svg(html, "delivered per minute")) == {"http": COLORS["http"]}
    # The browser drew the burst as a red bar (taller than any glyph), and the red health words.
    assert tallest_column(image, rgb(FAILURE_COLORS["failed"])) >= 20
    assert image.count_near(rgb(FAILURE_COLORS["failed"])) >= 300


async def test_the_listener_is_told_as_not_configured_connecting_catching_up_live_silent_or_stopped(
    redis_url: str,
) -> None:
    link = RedisLink(redis_url)
    log = RedisActivityLog(link)
    now = time.time()
    try:
        assert await log.listener() is None
        cases = {
            ListenerState(3.5, now, "catching_up", 7): ('class="warn"', "catching up (lag 3.5 s)"),
            ListenerState(0.0, now, "connecting", 0): ('class="warn"', "connecting (lag 0.0 s)"),
            ListenerState(1.25, now, "live", 2): (
                'class="ok"',
                "live, lag 1.2 s, 2 envelopes past the stored cursor",
            ),
            ListenerState(1.0, now - 600, "live", 0): (
                'class="bad"',
                "not reporting for 600 s (last seen live)",
            ),
            ListenerState(0.0, now - 600, "stopped", 0): ('class="off"', "stopped 600 s ago (a clean stop)"),
        }
        for state, (css, words) in cases.items():
            await log.set_listener(state)
            stored = await log.listener()
            assert stored == state  # through Redis and back
            stats = Stats({"apns": 0, "fcm": 0, "http": 0}, 0, None, None, {}, listener=stored, generated=now)
            assert f'<p id="listener" {css}>xmtpd: {words}</p>' in render(stats, set()), state
        no_listener = Stats({}, 0, None, None, {}, generated=now)
        assert '<p id="listener" class="off">xmtpd: not configured: no listener has reported' in render(
            no_listener, set()
        )
    finally:
        await link.close()


async def test_the_node_go_listener_is_told_beside_the_xmtpd_one(redis_url: str) -> None:
    link = RedisLink(redis_url)
    log = RedisActivityLog(link)
    now = time.time()
    try:
        await link.run(lambda client: client.delete(LISTENER_KEYS[NODE_GO]))
        assert await log.listener(NODE_GO) is None
        off = Stats({}, 0, None, None, {}, generated=now)
        assert '<p id="node-go-listener" class="off">node-go: not configured: none has reported' in render(
            off, set()
        )
        cases = {
            ListenerState(0.0, now, "connecting"): ('class="warn"', "connecting: what the node publishes"),
            ListenerState(0.25, now, "live"): ('class="ok"', "live, the last envelope read 0.2 s after"),
            ListenerState(0.0, now - 600, "live"): (
                'class="bad"',
                "not reporting for 600 s (last seen live)",
            ),
            ListenerState(0.0, now - 60, "stopped"): ('class="off"', "stopped 60 s ago (a clean stop)"),
        }
        xmtpd = ListenerState(1.0, now, "live", 3)
        await log.set_listener(xmtpd)
        for state, (css, words) in cases.items():
            await log.set_listener(state, NODE_GO)
            stored = await log.listener(NODE_GO)
            assert stored == state and await log.listener() == xmtpd  # each its own
            stats = Stats({}, 0, None, None, {}, listener=xmtpd, node_go_listener=stored, generated=now)
            assert f'<p id="node-go-listener" {css}>node-go: {words}' in render(stats, set()), state
    finally:
        await link.run(lambda client: client.delete(LISTENER_KEYS[NODE_GO]))
        await link.close()
