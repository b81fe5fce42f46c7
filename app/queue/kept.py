"""Whether Redis keeps the queue: its persistence at start, and a restart that lost the data.

A Redis without AOF or RDB snapshots loses every hint accepted and not yet sent when it restarts,
and nothing else would say so: it comes back empty, answers, and the processes go on. So each
process says at start when neither is on, and each partition holds a token made when its data began
(`xmtp-push:{pN}:kept`): when Redis serves again after an outage and a token this process saw is gone
or another, that partition's data was lost, and the process says so once and counts it. The first
process to look makes a new token; every other finds a token it has not seen, and says so too.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from app.core import metrics
from app.queue.redis_calls import tag

log = logging.getLogger(__name__)
SETTING = "XMTP_PUSH_REDIS_URL"
NOT_KEPT = (
    f"{SETTING}: Redis keeps nothing on disk (neither AOF nor RDB snapshots are on): hints accepted"
    " but not yet sent are lost if Redis restarts"
)
LOST = f"{SETTING}: Redis restarted without its data: queued hints were lost"


def kept_key(partition: int) -> str:
    return f"{tag(partition)}kept"


class KeptWatch:
    """The tokens this process saw, per partition; None before it has looked."""

    def __init__(self, partitions: Sequence[int]) -> None:
        self._partitions = list(partitions)
        self._seen: list[bytes | None] = [None] * len(self._partitions)

    async def look(self, client: Any) -> int:
        """Read the tokens (making those missing); returns how many partitions lost their data since
        this process last looked, said in one ERROR line and counted when any did."""
        token = secrets.token_hex(8).encode()
        pipe = client.pipeline(transaction=False)
        for partition in self._partitions:
            pipe.set(kept_key(partition), token, nx=True)
            pipe.get(kept_key(partition))
        now = (await pipe.execute())[1::2]
        lost = sum(1 for seen, held in zip(self._seen, now, strict=True) if seen is not None and seen != held)
        self._seen = list(now)
        if lost:
            metrics.queue_resets_total.inc()
            log.error("%s (%d of %d partitions)", LOST, lost, len(self._partitions))
        return lost


async def warn_if_not_kept(client: Any) -> bool:
    """One WARNING when a server of `client` (each primary of a cluster) has neither AOF nor RDB
    snapshots on; True when it warned. A server that refuses CONFIG (a managed one) is not judged."""
    nodes = client.get_primaries() if isinstance(client, RedisCluster) else [None]
    for node in nodes:
        options = {"target_nodes": node} if node is not None else {}
        info = await client.execute_command("INFO", "persistence", **options)
        if int(info.get("aof_enabled", 0)) == 1:
            continue
        try:
            saves = await client.execute_command("CONFIG GET", "save", **options)
        except ResponseError:
            continue
        if not _save_points(saves):
            log.warning("%s", NOT_KEPT)
            return True
    return False


def _save_points(reply: Any) -> str:
    """The `save` setting from a CONFIG GET reply (a dict, or a flat list of names and values)."""
    if isinstance(reply, dict):
        value = reply.get("save", reply.get(b"save", b""))
    else:
        value = reply[1] if len(reply) > 1 else b""
    return (value.decode() if isinstance(value, bytes) else str(value)).strip()
