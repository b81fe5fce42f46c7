"""The environment of `xmtp-push listen` and `xmtp-push worker` child processes on a test's stack."""

from __future__ import annotations

from tests.support.ops import child_env
from tests.support.pipeline import Stack


def stack_env(stack: Stack, **settings: str) -> dict[str, str]:
    """This environment without any XMTP_PUSH_* variable; the stack's database and Redis, the probes on
    a free port (several processes on one host), and `settings` (names without the prefix)."""
    assert stack.redis_url is not None, "`listen` and `worker` need Redis"
    return child_env(database_url=stack.database_url, redis_url=stack.redis_url, metrics_port="0", **settings)
