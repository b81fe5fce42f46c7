"""The queue's Redis keys and the script calls built on them.

Every key of partition p carries the hash tag `{p<p>}`, so all the keys one call touches hash to one
slot: a Redis Cluster runs the call on the primary holding that partition.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from app.queue import redis_scripts as lua
from app.queue.base import Commit
from app.queue.redis_scripts import Call, Script

GROUP_NAME = "workers"
GROUP = GROUP_NAME.encode()
PREFIX = "xmtp-push:"
# How long a delayed key's holder outlives its due time (it is promoted by then).
KEY_GRACE_SECONDS = 600

ADD, CLAIM, COMMIT, PROMOTE, READ = (
    Script.of(s) for s in (lua.ADD, lua.CLAIM, lua.COMMIT, lua.PROMOTE, lua.READ)
)
GONE = -1  # READ's reply when the stream or its group is gone


def tag(partition: int) -> str:
    return f"{PREFIX}{{p{partition}}}:"


def stream_key(stream: str, partition: int) -> str:
    return tag(partition) + stream


def delayed_key(partition: int) -> str:
    return tag(partition) + "delayed"


def commit_call(stream: str, commit: Commit) -> Call:
    p = commit.partition
    keys: list[Any] = [stream_key(stream, p), delayed_key(p)]
    additions = [(target, payloads) for target, payloads in commit.add.items() if payloads]
    args: list[Any] = [GROUP, len(additions)]
    for target, payloads in additions:
        keys.append(stream_key(target, p))
        args.extend(packed(payloads))
    # One member per payload, the last due time winning, as ZADD with a mapping did.
    delayed = {d.stream.encode() + b"\n" + d.payload: d for d in commit.delay}
    args.append(len(delayed))
    now = time.time()
    for member, d in delayed.items():
        index = 0
        if d.key:
            keys.append(f"{tag(p)}delayed-key:{d.key}")
            index = len(keys)  # Lua counts from 1
        ttl = int(max(0.0, d.due - now)) + KEY_GRACE_SECONDS
        args.extend((repr(float(d.due)), member, index, d.rank, ttl))
    args.append(len(commit.ack))
    args.extend(commit.ack)
    return Call(COMMIT, keys, args)


def read_call(key: str, consumer: str, count: int) -> Call:
    return Call(READ, [key], [GROUP, consumer, count])


def promote_call(partition: int, members: list[bytes]) -> Call:
    keys: list[str] = [delayed_key(partition)]
    indexes: list[bytes] = []
    for member in members:
        key = stream_key(_text(member.partition(b"\n")[0]), partition)
        if key not in keys:
            keys.append(key)
        indexes.append(b"%d" % (keys.index(key) + 1))
    return Call(PROMOTE, keys, [*packed(members), b",".join(indexes)])


def packed(payloads: Sequence[bytes]) -> list[bytes]:
    """The two script arguments that carry a stream's payloads."""
    return [b",".join(b"%d" % len(p) for p in payloads), b"".join(payloads)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
