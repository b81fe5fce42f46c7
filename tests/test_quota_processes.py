"""Quotas shared by every API process (docs/callers.md#quotas-per-caller): two real `xmtp-push api`
processes on one Redis, and on the test Redis Cluster, answer one caller's calls from one bucket, and
one ceiling on the recipients all callers create."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import pytest

from tests.support.builders import http, new_creds, register
from tests.support.ops import channel_env, free_port
from tests.support.pipeline import Stack, redis_stack, redis_url  # noqa: F401  (fixtures)
from tests.support.process import child, wait_answering
from tests.support.quotas import NOTIFICATIONS, send

pytestmark = pytest.mark.slow
REGISTER = NOTIFICATIONS + "Register"
CALLS, NEW_RECIPIENTS = 6, 10
HOOK = http(url="http://127.0.0.1:9/hook")


@dataclass
class Ports:
    grpc_channel: grpc.aio.Channel
    http: httpx.AsyncClient


@contextlib.asynccontextmanager
async def api_process(name: str, stack: Stack) -> AsyncIterator[tuple[Ports, list[str]]]:
    ports = {"http_port": str(free_port()), "grpc_port": str(free_port())}
    env = channel_env(
        stack.database_url,
        redis_url=stack.redis_url or "",
        caller_calls_per_minute=str(CALLS),
        new_recipients_per_minute=str(NEW_RECIPIENTS),
        trusted_proxies="127.0.0.0/8",
        **ports,
    )
    async with child(name, ["api"], env) as process:
        base = f"http://127.0.0.1:{ports['http_port']}"
        await wait_answering(base + "/healthz")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc_port']}")
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            try:
                yield Ports(channel, client), process.lines
            finally:
                await channel.close()
        assert await process.stop() == 0, process.output()


async def test_two_api_processes_share_each_quota(redis_stack: Stack) -> None:
    async with (
        api_process("api-a", redis_stack) as (a, a_lines),
        api_process("api-b", redis_stack) as (b, b_lines),
    ):
        first = {"x-forwarded-for": "198.51.100.7"}
        # One caller's calls, spread over both processes and both transports, from one bucket.
        for n in range(CALLS):
            target, transport = (a, "connect") if n % 2 else (b, "grpc")
            answer = await send(target, transport, REGISTER, register(new_creds(), HOOK), first)
            assert answer.code == "ok", (n, answer)
        assert (await send(a, "connect", REGISTER, register(new_creds(), HOOK), first)).throttled
        assert (await send(b, "grpc", REGISTER, register(new_creds(), HOOK), first)).throttled
        # The ceiling on new recipients is all callers' together: 6 made, 4 left, on either process.
        for n in range(NEW_RECIPIENTS - CALLS):
            other = {"x-forwarded-for": f"198.51.100.{20 + n}"}
            answer = await send(a if n % 2 else b, "grpc", REGISTER, register(new_creds(), HOOK), other)
            assert answer.code == "ok", (n, answer)
        late = {"x-forwarded-for": "198.51.100.99"}
        answer = await send(a, "connect", REGISTER, register(new_creds(), HOOK), late)
        assert answer.throttled and answer.retry_after is not None, answer
    logged = "\n".join(a_lines + b_lines)
    assert "quota calls: throttling callers" in logged
    assert "quota new_recipients: throttling callers" in logged
    assert "198.51.100." not in logged
