"""What one destination may cost (docs/callers.md#destinations): a fast webhook host's allowance
bounded by XMTP_PUSH_WEBHOOK_MAX_PER_FAST_HOST (old name XMTP_PUSH_HTTP_MAX_PER_FAST_HOST), a host's
parking told once per change and without the host, and each Web Push app without `allowed_endpoints`
warned about once at start-up."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from app.core.config import load_settings
from app.delivery.providers.webhook import WebhookProvider
from app.delivery.registry import webhook_config
from app.delivery.types import OutcomeKind
from app.delivery.url_policy import UrlPolicy
from app.fanout.hints import Hint, webhook_push
from app.matrix.config import load_gateway_config
from app.recipients.types import Target
from tests.support.egress import vapid_key_file
from tests.support.matrix import write_config
from tests.support.receivers import receiving

LOOPBACK = UrlPolicy(allow_insecure=True, allow_private_addresses=True)


def pushes(url: str, count: int) -> list[object]:
    target = Target(3, url, b"k" * 32, b"s" * 32)
    return [webhook_push(Hint(b"\x00" + bytes(16), n, n.to_bytes(32, "big")), target) for n in range(count)]


class FastReceiver:
    """Answers each POST after a short moment (a fast host), counting the most in flight at once."""

    def __init__(self) -> None:
        self.in_flight = self.most = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        return web.Response(status=200)


@pytest.fixture
async def fast() -> AsyncIterator[tuple[FastReceiver, str]]:
    receiver = FastReceiver()
    async with receiving(receiver.handle) as url:
        yield receiver, url


async def test_a_fast_host_takes_at_most_its_fast_allowance(fast: tuple[FastReceiver, str]) -> None:
    receiver, url = fast
    provider = WebhookProvider(LOOPBACK, timeout_seconds=10.0, max_per_host=4, max_per_fast_host=12)
    try:
        assert (await provider.send(pushes(url, 1)[0])).kind is OutcomeKind.DELIVERED  # shown fast
        outcomes = await asyncio.gather(*(provider.send(push) for push in pushes(url, 100)))  # type: ignore[arg-type]
    finally:
        await provider.close()
    kinds = [outcome.kind for outcome in outcomes]
    # The rest wait their turn in the queue, nothing dropped and no attempt spent.
    assert (kinds.count(OutcomeKind.DELIVERED), kinds.count(OutcomeKind.DEFERRED)) == (12, 88), kinds
    assert receiver.most == 12


def test_the_fast_allowance_is_read_under_both_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_ENABLED", "true")
    assert webhook_config(load_settings()).max_per_fast_host == 64  # type: ignore[union-attr]
    monkeypatch.setenv("XMTP_PUSH_WEBHOOK_MAX_PER_FAST_HOST", "40")
    assert webhook_config(load_settings()).max_per_fast_host == 40  # type: ignore[union-attr]
    monkeypatch.delenv("XMTP_PUSH_WEBHOOK_MAX_PER_FAST_HOST")
    monkeypatch.setenv("XMTP_PUSH_HTTP_MAX_PER_FAST_HOST", "48")
    assert webhook_config(load_settings()).max_per_fast_host == 48  # type: ignore[union-attr]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_hosts_parking_is_told_once_and_without_the_host(caplog: pytest.LogCaptureFixture) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/hook"
    provider = WebhookProvider(LOOPBACK, timeout_seconds=5.0, max_per_host=16)
    try:
        with caplog.at_level(logging.INFO, logger="app.delivery"):
            # 16 attempts in flight when the host refuses them all: it parks at the fifth failure.
            await asyncio.gather(*(provider.send(push) for push in pushes(url, 16)))  # type: ignore[arg-type]
            await asyncio.gather(*(provider.send(push) for push in pushes(url, 16)))  # type: ignore[arg-type]
    finally:
        await provider.close()
    told = [r.getMessage() for r in caplog.records if "webhook host" in r.getMessage()]
    assert told == ["a webhook host is parked after repeated timeouts or refused connections (1 parked)"]
    assert not any(str(port) in record.getMessage() for record in caplog.records)


def test_each_webpush_app_without_allowed_endpoints_is_warned_about_once(tmp_path: Path) -> None:
    web_app = {
        "type": "webpush",
        "vapid_private_key": vapid_key_file(tmp_path),
        "vapid_contact_email": "ops@example.org",
    }
    apps = {
        "org.web": web_app,
        "org.web.bounded": {**web_app, "allowed_endpoints": ["*.push.services.mozilla.com"]},
        "org.web.other": web_app,
    }
    warnings = load_gateway_config(write_config(tmp_path, apps)).warnings
    assert warnings == [
        f"XMTP_PUSH_MATRIX_APPS: apps.{app}.allowed_endpoints: not set, so this webpush app posts to any "
        "endpoint a pusher names; list the push services it accepts"
        for app in ("org.web", "org.web.other")
    ]
