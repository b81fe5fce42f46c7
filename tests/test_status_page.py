"""GET /status in a real browser: headless Chromium loads the page the API serves after a scripted
run with deliveries on two channels, takes a screenshot that must show the page (and its chart), and
dumps the DOM it rendered."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from app.api.status import COLORS
from app.testing.fake_apns import FakeApns, TlsFiles
from app.testing.keys import apns_key_pem
from app.testing.webhook_receiver import Receiver
from tests import ops_support, pipeline_support
from tests.ops_support import Image, read_png, required_tool, run_child, scripted_run
from tests.pipeline_support import running_pipeline

receiver = pipeline_support.receiver
redis_url = pipeline_support.redis_url
redis_postgresql_stack = pipeline_support.redis_postgresql_stack
tls = ops_support.tls
apns = ops_support.apns

BROWSER_SECONDS = 60.0
WIDTH, HEIGHT = 1000, 1200
BACKGROUND = (0xFA, 0xFA, 0xFA)


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


async def test_status_page_in_headless_chromium(
    redis_postgresql_stack: pipeline_support.Stack,
    receiver: Receiver,
    apns: FakeApns,
    tls: TlsFiles,
    tmp_path: Path,
) -> None:
    chromium = required_tool("chromium", "chromium")
    overrides = {"apns_key": apns_key_pem(), "apns_endpoint": apns.endpoint, "apns_ca_file": tls.ca_file}
    apns.reset()
    screenshot = tmp_path / "status.png"
    async with running_pipeline(redis_postgresql_stack, **overrides) as pipe:
        run = await scripted_run(pipe, receiver, apns)
        url = f"{pipe.http.base_url}/status"
        # The browser runs beside this event loop, which keeps serving the page.
        shot, dom = await asyncio.gather(
            run_child(
                chromium_args(chromium, tmp_path / "profile-shot", f"--screenshot={screenshot}", url),
                ops_support.child_env(),
                BROWSER_SECONDS,
            ),
            run_child(
                chromium_args(chromium, tmp_path / "profile-dom", "--dump-dom", url),
                ops_support.child_env(),
                BROWSER_SECONDS,
            ),
        )
    assert shot.returncode == 0, shot
    assert dom.returncode == 0, dom

    # What the page shows.
    html = dom.stdout
    assert "<h1>xmtp-push status</h1>" in html, html[:2000]
    for channel, counts in run.outcomes.items():
        cells = "".join(f"<td>{counts.get(o, 0)}</td>" for o in ("dead", "delivered"))
        assert f"<tr><td>{channel}</td>{cells}</tr>" in html, channel
    for queue in ("envelopes", "deliveries.apns", "deliveries.fcm", "deliveries.http", "retries waiting"):
        assert f"<tr><td>{queue}</td><td>0</td></tr>" in html, queue
    for channel, count in run.recipients.items():
        assert f"<tr><td>{channel}</td><td>{count}</td></tr>" in html, channel
    assert f"<p>{run.subscriptions} subscriptions.</p>" in html
    polylines = re.findall(
        r'<polyline fill="none" stroke="(#[0-9a-f]{6})" stroke-width="2" points="([^"]+)"', html
    )
    assert sorted(color for color, _ in polylines) == sorted([COLORS["apns"], COLORS["http"]]), polylines
    for _, points in polylines:
        assert len(points.split()) == 60  # one point per minute of the last hour

    # What the browser drew: a page, not a blank (or error) screen, with the chart's lines in it.
    assert screenshot.is_file(), shot
    image = read_png(screenshot.read_bytes())
    assert (image.width, image.height) == (WIDTH, HEIGHT)
    colors = image.colors()
    assert len(colors) >= 50, f"only {len(colors)} colours: a blank page?"
    drawn = sum(1 for p in image.pixels if p != BACKGROUND)
    assert drawn > 0.02 * len(image.pixels), f"only {drawn} pixels differ from the background"
    # http's line is drawn last: its flat stretch at zero covers most of the chart's width...
    length, baseline, left = longest_run(image, rgb(COLORS["http"]))
    assert length >= 300, length
    # ...and apns's line rises above it inside the chart (the legend is below the chart).
    apns_color = rgb(COLORS["apns"])
    rising = [
        (x, y)
        for y in range(max(0, baseline - 200), baseline)
        for x in range(left, left + length + 20)
        if near(image.pixels[y * image.width + x], apns_color)
    ]
    assert len(rising) >= 10, rising
