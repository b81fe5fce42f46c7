"""The Synapse harness: a real homeserver's pusher reaches a push gateway on loopback.

Two users share a room; one sets an `http` pusher (`event_id_only`) at a recording gateway on a
local port; the other sends a message. The gateway must receive that event's ids in the shape the
Matrix gateway is built for, and a pushkey it answers as rejected must make Synapse delete the pusher.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.synapse_support import Synapse, synapse  # noqa: F401  (the fixture)

APP_ID = "org.example.harness"
PUSHKEY = "aGFybmVzcy1wdXNoa2V5"


class RecordingGateway:
    """Records each notify request and answers with `rejected` as set."""

    def __init__(self) -> None:
        self.notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.rejected: list[str] = []
        self.url = ""

    async def notify(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self.notifications.put(body["notification"])
        return web.json_response({"rejected": self.rejected})


@pytest.fixture
async def gateway() -> AsyncIterator[RecordingGateway]:
    recorder = RecordingGateway()
    app = web.Application()
    app.router.add_post("/_matrix/push/v1/notify", recorder.notify)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    recorder.url = f"http://127.0.0.1:{runner.addresses[0][1]}/_matrix/push/v1/notify"
    yield recorder
    await runner.cleanup()


async def next_event(gateway: RecordingGateway, event_id: str) -> dict[str, Any]:
    """The first notification about `event_id` (badge-only updates may come first)."""
    while True:
        notification = await asyncio.wait_for(gateway.notifications.get(), 20)
        if notification.get("event_id") == event_id:
            return notification


async def test_a_pusher_reaches_a_loopback_gateway_and_a_rejected_pushkey_deletes_it(
    synapse: Synapse, gateway: RecordingGateway
) -> None:
    async with synapse.client() as client:
        alice = await synapse.register(client, "harness-alice", "alice-password")
        bob = await synapse.register(client, "harness-bob", "bob-password")
        room = await alice.create_room(invite=[bob.user_id])
        await bob.join(room)
        await bob.set_pusher(gateway.url, APP_ID, PUSHKEY, data={"format": "event_id_only"})

        event_id = await alice.send_message(room, "hello")
        notification = await next_event(gateway, event_id)
        assert notification["room_id"] == room
        assert notification["counts"]["unread"] >= 1
        [device] = notification["devices"]
        assert (device["app_id"], device["pushkey"]) == (APP_ID, PUSHKEY)
        assert device["data"] == {"format": "event_id_only"}
        assert "content" not in notification and "sender" not in notification

        gateway.rejected = [PUSHKEY]
        second = await alice.send_message(room, "are you there?")
        await next_event(gateway, second)
        for _ in range(100):
            if not await bob.pushers():
                break
            await asyncio.sleep(0.1)
        assert await bob.pushers() == []
