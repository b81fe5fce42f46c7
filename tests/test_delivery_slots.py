"""The delivery worker's slots outlive a provider that raises.

A provider is meant to answer every attempt with an outcome, but a bug in one
must not cost the worker its concurrency: the attempt's entry stays pending and
is reclaimed, and the slot takes the next attempt. The provider here is a test
implementation of the provider interface (it raises on its first calls, then
delivers); the queue, database, fan-out and worker are the real ones.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from app.core.channels import Channel
from app.delivery.types import DELIVERED, Outcome, Push
from app.queue.base import Share
from app.recipients.targets import RecipientTargets
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.pipeline import envelope, group_topic, running_pipeline, wait_until
from workers.delivery_worker import DeliveryWorker, XmtpDeliveries
from workers.fanout_worker import run_fanout

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

redis_url = pipeline_support.redis_url
some_stack = pipeline_support.some_stack


class RaisesFirst:
    channel, app = Channel.HTTP, "default"

    def __init__(self, raises: int) -> None:
        self.raises = raises
        self.sent: list[bytes] = []  # recipient ids, in order of delivery

    async def send(self, push: Push) -> Outcome:
        await asyncio.sleep(0)
        if self.raises:
            self.raises -= 1
            raise RuntimeError("a bug in a provider")
        assert isinstance(push.payload, bytes)
        self.sent.append(bytes.fromhex(json.loads(push.payload)["recipient_id"]))
        return DELIVERED

    async def close(self) -> None:
        return None


async def test_slots_go_on_after_attempts_raise_and_the_raised_ones_are_reclaimed(
    some_stack, receiver: Receiver
) -> None:
    # Two slots, and the first two attempts raise: both slots meet an exception before any delivery.
    overrides = {"delivery_concurrency": 2, "queue_reclaim_seconds": 1.0}
    async with running_pipeline(some_stack, workers=False, **overrides) as pipe:
        topic = group_topic()
        members = [await pipe.member(receiver.endpoint(), topic) for _ in range(6)]
        await pipe.ingest_ok([envelope(topic, 5)])
        provider, stop, queue = RaisesFirst(raises=2), asyncio.Event(), pipe.runtime.queue
        targets = RecipientTargets(pipe.runtime.sessions, pipe.runtime.reads)
        assert queue is not None
        worker = DeliveryWorker(
            pipe.runtime,
            queue,
            provider,
            XmtpDeliveries(targets),
            "slots-test-http",
            Share.everything(queue.partitions),
        )
        tasks = [
            asyncio.create_task(
                run_fanout(pipe.runtime, queue, "slots-test", Share.everything(queue.partitions), stop)
            ),
            asyncio.create_task(worker.run(stop)),
        ]
        try:
            # The four that did not raise go out on the same two slots, at once.
            await wait_until(lambda: len(provider.sent) >= 4, 5, "the attempts after the exceptions")
            # The two that raised are reclaimed after the reclaim period, and delivered then.
            await wait_until(lambda: len(provider.sent) >= 6, 10, "the reclaimed attempts")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert sorted(provider.sent) == sorted(m.rid for m in members)
