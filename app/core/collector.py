"""Garbage-collector settings of the long-running processes.

A serving process makes most of its long-lived objects at start-up (modules, ORM
metadata, protobuf descriptors, clients) and then allocates short-lived ones at
a high rate: every delivery attempt builds a request, a response and their
futures. With Python's defaults the collector rescans the start-up objects over
and over and runs a young collection every 700 allocations; under load that
took about a quarter of a worker's CPU.
"""

from __future__ import annotations

import gc


def settle_after_start_up(young_threshold: int) -> None:
    """Collect start-up garbage once, exempt what remains from later collections, and let the young
    generation grow to `young_threshold` allocations before each collection of it. Objects freed by
    reference counting (nearly all of the per-request ones) are unaffected; cycles among the
    short-lived ones are still collected, only less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
