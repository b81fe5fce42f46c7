"""The bare loop: the fastest plain client posting the very same signed bodies to the same receiver."""

from __future__ import annotations

import asyncio
import base64
import collections
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import aiohttp
from standardwebhooks.webhooks import Webhook

from bench.pipeline.recipients import Recipient


def signed_post(recipient: Recipient, sequence_id: int) -> tuple[bytes, dict[str, str]]:
    """The body and webhook headers of one hint, signed with standardwebhooks."""
    topic = base64.b64encode(recipient.topic).decode()
    body = f'{{"topic":"{topic}","sequence_id":"{sequence_id}","recipient_id":"{recipient.id.hex()}"}}'
    message_id = f"bare_{sequence_id}_{recipient.id[:8].hex()}"
    now = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(now),
        "webhook-signature": Webhook(recipient.key).sign(
            message_id, datetime.fromtimestamp(now, tz=UTC), body
        ),
    }
    return body.encode(), headers


async def bare_loop(
    port: int, deliveries: Sequence[tuple[Recipient, int]], concurrency: int
) -> tuple[float, int, collections.Counter[str]]:
    """The fastest plain client: sign and post each body, `concurrency` in flight; (seconds, ok, errors)."""
    url = f"http://127.0.0.1:{port}/hook"
    errors: collections.Counter[str] = collections.Counter()
    ok = 0
    connector = aiohttp.TCPConnector(limit=max(concurrency, 512), limit_per_host=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=10), skip_auto_headers=("User-Agent",)
    ) as session:
        work = iter(deliveries)

        async def one() -> None:
            nonlocal ok
            for recipient, sequence_id in work:
                body, headers = signed_post(recipient, sequence_id)
                try:
                    async with session.post(
                        url, data=body, headers=headers, allow_redirects=False
                    ) as response:
                        await response.read()
                        if 200 <= response.status < 300:
                            ok += 1
                        else:
                            errors[f"HTTP {response.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as error:
                    errors[type(error).__name__] += 1

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return elapsed, ok, errors
