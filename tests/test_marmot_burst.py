"""Bursts of triggers through a real relay. A LocalRelay drops the live events a subscriber falls more
than 1,024 behind on once its socket is full, so the server's relay readers never wait for a handler:
live triggers wait in one buffer bounded in bytes, taken in arrival order by MARMOT_MAX_CONCURRENT
handlers, whose CPU work runs in turns so that the readers keep reading; a trigger the buffer has no
room for is refused, counted as rate limited; on the way out, what is buffered and in flight gets the
stop's grace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import pytest

from app.core.config import MARMOT_MAX_FRAME_BYTES
from app.marmot.giftwrap import wrap_trigger
from app.marmot.keys import ServerKey
from app.marmot.tokens import ENCRYPTED_TOKEN_SIZE, Platform, encrypt_token
from fakes.fake_apns import FakeApns
from fakes.fake_apns import Reply as ApnsReply
from fakes.fake_fcm import FakeFcm
from tests.support import frozen_heap
from tests.support.marmot import (  # noqa: F401  (fixtures)
    RAISED_RATE_LIMIT,
    fakes,
    key,
    marmot_settings,
    running_relay,
    sample,
    serving,
    settle,
    triggers,
)

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

BURST = 1_500
# One token and seven chunks of padding: ~28 KB a gift wrap, so the burst (~42 MB) overflows the
# socket's buffers while the handlers are busy, and each trigger costs a handler ~2 ms of CPU.
PADDING_CHUNKS = 7
# Every rate tier out of the way: the burst must reach APNs whole.
RAISED_TIERS = {
    f"marmot_{tier}_per_{period}": 1_000_000
    for tier in ("global", "chunk", "device")
    for period in ("minute", "hour")
}
# With the default 64 handlers: one-token wraps, each ~0.6 ms of CPU and ~5 KB (the burst: ~19 MB).
DEFAULT_HANDLERS_BURST = 4_000
# A gift wrap of 16 chunks: ~55 KB (a LocalRelay takes events up to 64 KiB). The smallest buffer
# allowed (256 KiB) holds four, and a one-token wrap more.
LARGE_PADDING = 15
HELD = "11" * 32  # its push is answered only on FakeApns.release()


def apns_token(number: int) -> str:
    return f"{number:064x}"


def wraps_of(key: ServerKey, tokens: list[str], padding: int = 0) -> list[dict[str, Any]]:
    """One gift wrap per token, each holding that token and `padding` chunks of random bytes."""
    return [
        wrap_trigger(
            encrypt_token(key.public_x, Platform.APNS, token) + os.urandom(padding * ENCRYPTED_TOKEN_SIZE),
            key.public_x,
        )
        for token in tokens
    ]


def frame_size(wrap: dict[str, Any]) -> int:
    """About the length of the relay's frame carrying `wrap`, what the buffer charges it (our
    subscription ids are 16 characters)."""
    return len(json.dumps(["EVENT", "0" * 16, wrap]))


def pending() -> float:
    return sample("xmtp_push_marmot_pending")


async def burst_reaches_apns_exactly_once(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], wraps: list[dict[str, Any]], **overrides: Any
) -> None:
    """Publish `wraps` (one token each, in `apns_token` order) at once: every push arrives once."""
    apns, _ = fakes
    tokens = [apns_token(number) for number in range(len(wraps))]
    accepted, limited = triggers("accepted"), triggers("rate_limited")
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(fakes, key, relay.url, **RAISED_TIERS, **overrides)
        async with serving(settings):
            started = time.monotonic()
            with frozen_heap():  # a long run's full collection would put the reader behind the relay
                await relay.publish_all(wraps)
                published = time.monotonic() - started
                try:
                    await apns.wait_for(len(wraps), timeout=30)
                finally:
                    print(
                        f"{len(wraps)} triggers published in {published:.1f} s, {apns.count} pushes in"
                        f" {time.monotonic() - started:.1f} s,"
                        f" {triggers('rate_limited') - limited:.0f} rate limited"
                    )
            await settle("accepted", accepted, len(wraps))
    assert sorted(request.token for request in apns.requests) == tokens
    assert triggers("rate_limited") == limited


async def test_a_burst_reaches_apns_exactly_once_with_four_handlers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    wraps = wraps_of(key, [apns_token(number) for number in range(BURST)], PADDING_CHUNKS)
    await burst_reaches_apns_exactly_once(key, fakes, wraps, marmot_max_concurrent=4)


async def test_a_burst_of_one_token_triggers_reaches_apns_exactly_once_with_the_default_handlers(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    wraps = wraps_of(key, [apns_token(number) for number in range(DEFAULT_HANDLERS_BURST)])
    await burst_reaches_apns_exactly_once(key, fakes, wraps)


async def test_a_trigger_the_buffer_has_no_bytes_for_is_refused_as_rate_limited(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm], caplog: pytest.LogCaptureFixture
) -> None:
    apns, _ = fakes
    apns.script(HELD, ApnsReply(200, held=True))
    tokens = [apns_token(number) for number in range(1, 8)]
    large, small = wraps_of(key, tokens[:5], LARGE_PADDING), wraps_of(key, tokens[5:6])
    assert 4 * frame_size(large[0]) + frame_size(small[0]) < MARMOT_MAX_FRAME_BYTES < 5 * frame_size(large[0])
    accepted, limited, waiting = triggers("accepted"), triggers("rate_limited"), pending()
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(
            fakes, key, relay.url, marmot_max_concurrent=1, marmot_pending_bytes=MARMOT_MAX_FRAME_BYTES
        )
        with caplog.at_level(logging.INFO, logger="app.marmot.pending"):
            async with serving(settings):
                await relay.publish_all(wraps_of(key, [HELD]))
                await apns.wait_for(1)  # the one handler waits for APNs's answer
                await relay.publish_all(large)  # four fit, the fifth does not
                await relay.publish_all(small)  # but a small one does
                await settle("rate_limited", limited, 1)
                assert pending() == waiting + 5
                apns.release()
                await settle("accepted", accepted, 6)
                await relay.publish_all(wraps_of(key, tokens[6:], LARGE_PADDING))  # room again
                await settle("accepted", accepted, 7)
    assert [request.token for request in apns.requests] == [HELD, *tokens[:4], *tokens[5:]]
    assert triggers("rate_limited") == limited + 1
    assert pending() == waiting
    (full,) = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert full.getMessage() == (
        "pending triggers full (262144 bytes): live triggers refused, 1 since this was last logged"
    )


async def test_buffered_and_in_flight_triggers_finish_on_the_way_out(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    apns.script(HELD, ApnsReply(200, held=True))
    tokens = [apns_token(number) for number in range(1, 3)]
    accepted = triggers("accepted")
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_max_concurrent=1)
        async with serving(settings):
            await relay.publish_all(wraps_of(key, [HELD, *tokens]))
            await apns.wait_for(1)
            await asyncio.sleep(0.2)  # the other two wait in the buffer
            asyncio.get_running_loop().call_later(0.5, apns.release)
        # The server has stopped: the held push was answered and the two buffered ones were sent.
    assert [request.token for request in apns.requests] == [HELD, *tokens]
    assert triggers("accepted") == accepted + 3


async def test_what_the_grace_leaves_is_dropped(
    key: ServerKey,
    fakes: tuple[FakeApns, FakeFcm],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apns, _ = fakes
    apns.script(HELD, ApnsReply(200, held=True))  # never released
    monkeypatch.setattr("workers.marmot_server.STOP_GRACE_SECONDS", 0.5)
    waiting = pending()
    async with running_relay(rate_limit=RAISED_RATE_LIMIT) as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_max_concurrent=1)
        with caplog.at_level(logging.INFO, logger="app.marmot.pending"):
            async with serving(settings):
                await relay.publish_all(wraps_of(key, [HELD, apns_token(1)]))
                await apns.wait_for(1)
                await asyncio.sleep(0.2)
                assert pending() == waiting + 1
                stopping = time.monotonic()
    assert time.monotonic() - stopping < 5
    assert [request.token for request in apns.requests] == [HELD]
    assert pending() == waiting
    assert "1 pending trigger(s) dropped on the way out" in caplog.messages
