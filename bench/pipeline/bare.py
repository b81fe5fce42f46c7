"""The bare loop: the fastest plain client posting the very same signed bodies to the same receiver."""

from __future__ import annotations

import asyncio
import base64
import collections
import hmac
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import aiohttp
from standardwebhooks.webhooks import Webhook

from bench.pipeline.recipients import Recipient


def signed_post(recipient: Recipient, sequence_id: int) -> tuple[bytes, dict[str, str]]:
    """The body and Standard Webhooks headers of one hint. Signed the cheapest way, one
    `hmac.digest` call, as the backend signs; `library_signature` gives the same bytes."""
    topic = base64.b64encode(recipient.topic).decode()
    body = f'{{"topic":"{topic}","sequence_id":"{sequence_id}","recipient_id":"{recipient.id.hex()}"}}'
    message_id = f"bare_{sequence_id}_{recipient.id[:8].hex()}"
    now = str(int(time.time()))
    mac = hmac.digest(recipient.key, f"{message_id}.{now}.{body}".encode(), "sha256")
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": now,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }
    return body.encode(), headers


def library_signature(recipient: Recipient, message_id: str, timestamp: str, body: bytes) -> str:
    """The standardwebhooks library's signature of a bare post, to check `signed_post` against."""
    moment = datetime.fromtimestamp(int(timestamp), tz=UTC)
    return Webhook(recipient.key).sign(message_id, moment, body.decode())


def check_signing(recipient: Recipient, sequence_id: int) -> None:
    """Stop the run if the bare loop's signature is not byte for byte the library's."""
    body, headers = signed_post(recipient, sequence_id)
    expected = library_signature(recipient, headers["webhook-id"], headers["webhook-timestamp"], body)
    if headers["webhook-signature"] != expected:
        raise SystemExit("bare loop: its signature differs from the standardwebhooks library's")


async def bare_loop(
    port: int, deliveries: Sequence[tuple[Recipient, int]], concurrency: int
) -> tuple[float, int, collections.Counter[str]]:
    """The fastest plain client: sign and post each body, `concurrency` in flight; (seconds, ok, errors)."""
    url = f"http://127.0.0.1:{port}/hook"
    if deliveries:
        check_signing(*deliveries[0])
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
