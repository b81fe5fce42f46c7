"""Receivers that answer badly cost the webhook channel nothing: a huge answer is not read.

The receiver is a real HTTP server on loopback; the provider, aiohttp and the URL policy are ours,
unchanged. A receiver answering 200 with an endless body must get its hint delivered, while the
worker reads at most 4 KiB of the answer and hangs up.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import psutil
import pytest
from aiohttp import web

from app.delivery.providers.webhook import WebhookProvider
from app.delivery.types import OutcomeKind
from app.delivery.url_policy import UrlPolicy
from app.fanout.hints import Hint, webhook_push
from app.recipients.types import Target
from tests.support.receivers import receiving

LOOPBACK = UrlPolicy(allow_insecure=True, allow_private_addresses=True)
HUGE = 1024 * 1024 * 1024  # what the receiver offers to send
CHUNK = 1024 * 1024


class HugeAnswers:
    """Answers every POST with 200 and up to 1 GiB of body, counting what it managed to write."""

    def __init__(self) -> None:
        self.written: list[int] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200, headers={"content-length": str(HUGE)})
        await response.prepare(request)
        written = 0
        try:
            while written < HUGE:
                await response.write(b"x" * CHUNK)
                written += CHUNK
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.written.append(written)
        return response


@pytest.fixture
async def huge() -> AsyncIterator[tuple[HugeAnswers, str]]:
    receiver = HugeAnswers()
    async with receiving(receiver.handle) as url:
        yield receiver, url


async def test_a_receiver_answering_with_a_huge_body_gets_its_hint_and_is_not_read(
    huge: tuple[HugeAnswers, str],
) -> None:
    receiver, url = huge
    provider = WebhookProvider(LOOPBACK, timeout_seconds=10.0)
    rss_before = psutil.Process(os.getpid()).memory_info().rss
    try:
        hints = [Hint(b"\x00" + bytes(16), n, bytes([n]) * 32) for n in range(2)]
        target = Target(3, url, b"k" * 32, b"s" * 32)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(provider.send(webhook_push(hint, target)) for hint in hints)), 10
        )
    finally:
        await provider.close()
    grown_mb = (psutil.Process(os.getpid()).memory_info().rss - rss_before) / 1e6
    print(f"two 1 GiB answers: the process grew {grown_mb:.1f} MB; the receiver wrote {receiver.written}")
    assert [o.kind for o in outcomes] == [OutcomeKind.DELIVERED] * 2
    await asyncio.sleep(0.2)  # the receiver notices the hang-up
    assert len(receiver.written) == 2
    # The receiver wrote what socket buffers took before the hang-up, far from the whole GiB.
    assert max(receiver.written) < 64 * CHUNK, receiver.written
    assert grown_mb < 50, f"the process grew {grown_mb:.0f} MB"
