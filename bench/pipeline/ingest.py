"""Envelopes into the backend over `POST /v1/envelopes`, closed loop or open loop."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.pipeline.processes import INGEST_TOKEN


def envelope_json(topic: bytes, sequence_id: int) -> dict[str, Any]:
    return {
        "topic": base64.b64encode(topic).decode(),
        "sequence_id": str(sequence_id),
        "server_ns": time.time_ns(),
        "kind": "group_message",
        "should_push": True,
    }


@dataclass
class IngestLog:
    sent_ns: dict[int, int] = field(default_factory=dict)  # sequence_id -> monotonic ns the request was sent
    start_lag: list[float] = field(default_factory=list)  # open loop: scheduled -> sent, seconds
    request_seconds: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    first_sent: int = 0
    last_sent: int = 0
    last_done: int = 0

    def refused(self, batch: Sequence[tuple[bytes, int]], reason: str) -> None:
        self.errors[reason] += len(batch)
        for _, sequence_id in batch:
            self.sent_ns.pop(sequence_id, None)


class Ingestor:
    def __init__(self, session: aiohttp.ClientSession, http_port: int) -> None:
        self.session = session
        self.url = f"http://127.0.0.1:{http_port}/v1/envelopes"
        self.headers = {"authorization": f"Bearer {INGEST_TOKEN}", "content-type": "application/json"}

    async def post(self, batch: Sequence[tuple[bytes, int]], log: IngestLog) -> None:
        body = json.dumps(
            {"envelopes": [envelope_json(t, s) for t, s in batch]}, separators=(",", ":")
        ).encode()
        sent = time.monotonic_ns()
        for _, sequence_id in batch:
            log.sent_ns[sequence_id] = sent
        if not log.first_sent:
            log.first_sent = sent
        log.last_sent = max(log.last_sent, sent)
        try:
            async with self.session.post(self.url, data=body, headers=self.headers) as response:
                await response.read()
                if response.status != 202:
                    log.refused(batch, f"HTTP {response.status}")
        except (aiohttp.ClientError, TimeoutError) as error:
            log.refused(batch, type(error).__name__)
        done = time.monotonic_ns()
        log.last_done = max(log.last_done, done)
        log.request_seconds.append((done - sent) / 1e9)

    async def closed_loop(
        self, envelopes: Sequence[tuple[bytes, int]], batch: int, concurrency: int
    ) -> IngestLog:
        log = IngestLog()
        batches = [envelopes[i : i + batch] for i in range(0, len(envelopes), batch)]
        position = iter(batches)

        async def one() -> None:
            for item in position:
                await self.post(item, log)

        await asyncio.gather(*(one() for _ in range(concurrency)))
        return log

    async def open_loop(
        self, envelopes: Sequence[tuple[bytes, int]], envelopes_per_second: float, tick: float
    ) -> IngestLog:
        """Every `tick` s the envelopes due by then go out as one request, whatever earlier ones are doing."""
        log = IngestLog()
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.05
        tasks: set[asyncio.Task[None]] = set()
        index = 0
        tick_no = 0
        while index < len(envelopes):
            scheduled = t0 + tick_no * tick
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            due = min(len(envelopes), round((tick_no + 1) * tick * envelopes_per_second))
            tick_no += 1
            if due <= index:
                continue
            batch = envelopes[index:due]
            index = due
            log.start_lag.append(loop.time() - scheduled)
            task = asyncio.create_task(self.post(batch, log))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return log
