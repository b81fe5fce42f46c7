"""The fan-out's claim per envelope, with entries that share an id.

Two partitions added to in one millisecond give their entries the same id (each partition's stream
numbers its own). An envelope taken in twice (a retried ingest, two listeners, a catch-up over the
stream) is fanned out by whichever copy claims it first; a copy that finds the claim taken is dropped.
Here a retried ingest brings, in one addition, a new envelope and a repeat of one already fanned out,
in two partitions: the new one must go out once and the repeat not again, whatever ids they share.
"""

from __future__ import annotations

from collections import Counter

from app.queue.base import partition_of
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.pipeline import Stack, envelope, group_topic, hints_of, running_pipeline, wait_until

redis_url = pipeline_support.redis_url
some_stack = pipeline_support.some_stack


def topics_in_two_partitions(partitions: int) -> tuple[bytes, bytes]:
    first = group_topic()
    while partition_of(second := group_topic(), partitions) == partition_of(first, partitions):
        pass
    return first, second


async def test_a_repeat_beside_a_new_envelope_in_one_millisecond_goes_out_once_each(
    some_stack: Stack, receiver: Receiver
) -> None:
    async with running_pipeline(some_stack) as pipe:
        assert pipe.runtime.queue is not None
        fresh, repeated = topics_in_two_partitions(pipe.runtime.queue.partitions)
        fresh_member = await pipe.member(receiver.endpoint(), fresh)
        repeated_member = await pipe.member(receiver.endpoint(), repeated)

        async def one_round(n: int) -> None:
            await pipe.ingest_ok([envelope(repeated, n)])
            await wait_until(
                lambda: hints_of(receiver, repeated_member)[repeated, n] == 1, 15, "the first ingest's hint"
            )
            # The retry: both envelopes in one addition, each to its topic's partition.
            await pipe.ingest_ok([envelope(fresh, n), envelope(repeated, n)])
            await wait_until(
                lambda: hints_of(receiver, fresh_member)[fresh, n] >= 1, 15, "the new envelope's hint"
            )

        rounds = range(1, 4)
        for round_number in rounds:
            await one_round(round_number)
        await pipe.settled(receiver)

        assert hints_of(receiver, fresh_member) == Counter({(fresh, n): 1 for n in rounds})
        assert hints_of(receiver, repeated_member) == Counter({(repeated, n): 1 for n in rounds})
