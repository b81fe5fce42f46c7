"""`xmtp-push marmot`'s /readyz follows its providers (docs/marmot.md, step 4): 503 while most of a
provider's recent pushes fail for reasons not the token's, 200 again once its pushes succeed; tokens
that are dead or not the app's never turn it, whoever sent them."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.marmot import secp
from app.marmot.keys import ServerKey
from app.marmot.push_health import MIN_PUSHES, WINDOW
from fakes.fake_apns import FakeApns
from fakes.fake_apns import Reply as ApnsReply
from fakes.fake_fcm import FakeFcm
from tests.support import eventually
from tests.support.marmot import (  # noqa: F401  (fixtures)
    Relay,
    apns_chunk,
    fakes,
    marmot_env,
    running_relay,
    send,
)
from tests.support.ops import free_port
from tests.support.process import Child, child, clean_env

# Each test here runs the product end to end: a second or more.
pytestmark = pytest.mark.slow

DELIVERED = re.compile(r'^xmtp_push_marmot_tokens_total\{outcome="(\w+)",platform="apns"\} (\S+)$', re.M)
FAILING = re.compile(r"apns pushes keep failing \(5 of the last 5, for reasons not the token's\)")
RECOVERED = re.compile(r"apns pushes succeed again")


class Probe:
    """The process's /readyz and its APNs token counts."""

    def __init__(self, http_port: int) -> None:
        self._http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=5)

    async def readyz(self) -> tuple[int, Any]:
        response = await self._http.get("/readyz")
        return response.status_code, response.json()

    async def apns_tokens(self) -> float:
        """APNs tokens counted so far, whatever their outcome (each counted once its push answered)."""
        text = (await self._http.get("/metrics")).text
        return sum(float(count) for _, count in DELIVERED.findall(text))

    async def pushed(self, count: float) -> None:
        async def answered() -> bool:
            return await self.apns_tokens() >= count

        await eventually(answered, 20.0, f"{count} APNs pushes answered")


class Server:
    """`xmtp-push marmot` on a relay and the fakes, ready: triggers for one APNs token each go to it."""

    def __init__(self, relay: Relay, key: ServerKey, probe: Probe, process: Child) -> None:
        self.relay, self.key, self.probe, self.process = relay, key, probe, process
        self.sent = 0

    async def push(self, token: str) -> None:
        """One trigger for `token`, returning once its push is answered and counted."""
        await send(self.relay, self.key, apns_chunk(self.key, token))
        self.sent += 1
        await self.probe.pushed(self.sent)


@asynccontextmanager
async def serving(fakes: tuple[FakeApns, FakeFcm]) -> AsyncIterator[Server]:
    apns, fcm = fakes
    key, http_port = ServerKey(secp.fresh_secret()), free_port()
    probe = Probe(http_port)
    async with running_relay() as relay:
        env = clean_env(**marmot_env(key, relay.url, http_port, apns, fcm))
        async with child("marmot", ["marmot"], env) as process:
            await eventually(lambda: _ready(probe), 30.0, "/readyz 200")
            yield Server(relay, key, probe, process)
            assert await process.stop() == 0, process.output()


async def test_readyz_is_503_while_apns_keeps_failing_and_200_once_it_pushes_again(
    fakes: tuple[FakeApns, FakeFcm],
) -> None:
    failing = "ee" * 32
    fakes[0].script(failing, ApnsReply(500, "InternalServerError"))
    async with serving(fakes) as server:
        for _ in range(MIN_PUSHES):
            await server.push(failing)
        assert await server.probe.readyz() == (
            503,
            {"status": "unavailable", "checks": {"relays": "ok", "push": "unavailable"}},
        )
        await server.process.line(FAILING)
        await server.push("01" * 32)
        assert (await server.probe.readyz())[0] == 503  # one success is not enough after five failures
        successes = 1
        while (await server.probe.readyz())[0] == 503 and successes < WINDOW:
            successes += 1
            await server.push(f"{successes:02x}" * 32)
        assert await server.probe.readyz() == (
            200,
            {"status": "ok", "checks": {"relays": "ok", "push": "ok"}},
        )
        await server.process.line(RECOVERED)
    assert failing not in "\n".join(server.process.lines)


@pytest.mark.parametrize(
    "reply", [ApnsReply(410, "Unregistered"), ApnsReply(400, "BadDeviceToken")], ids=["dead", "foreign"]
)
async def test_tokens_that_are_dead_or_not_the_apps_never_turn_it(
    reply: ApnsReply, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    bad = "dd" * 32
    fakes[0].script(bad, reply)
    async with serving(fakes) as server:
        for _ in range(WINDOW):
            await server.push(bad)
        assert (await server.probe.readyz())[0] == 200
    assert not any("keep failing" in line for line in server.process.lines)


async def _ready(probe: Probe) -> bool:
    try:
        return (await probe.readyz())[0] == 200
    except httpx.HTTPError:
        return False
