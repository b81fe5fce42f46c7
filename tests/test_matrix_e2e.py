"""End to end with a real homeserver: Synapse (its own virtualenv, SQLite, loopback) pushes through
our gateway to the local HTTP/2 APNs fake.

Two users share a room; one sets an `http` pusher (`event_id_only`) at the gateway, running on a
real port with an APNs app pointed at the fake; the other sends a message. The fake must receive
the push for that event, at the hex token of the base64 pushkey, with the event's ids. Then the
fake answers 410 `Unregistered`: the gateway rejects the pushkey and Synapse deletes the pusher.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.fake_apns import OK, FakeApns, Reply
from fakes.tls import TlsFiles
from tests.support.matrix import (
    NOTIFY,
    TOPIC,
    apns_app,
    b64,
    gateway_settings,
    running,
    write_config,
    write_key_files,
)
from tests.support.synapse import MatrixUser, Synapse, synapse  # noqa: F401  (the fixture)

APP_ID = "org.example.matrix.ios"
PUSHER_WAIT_SECONDS = 20.0


@pytest.fixture
def apns(tls: TlsFiles) -> Iterator[FakeApns]:
    with FakeApns(tls) as fake:
        yield fake


async def pushers_gone(user: MatrixUser) -> bool:
    deadline = asyncio.get_running_loop().time() + PUSHER_WAIT_SECONDS
    while asyncio.get_running_loop().time() < deadline:
        if not await user.pushers():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_message_reaches_the_apns_fake_through_the_gateway_and_a_dead_token_deletes_the_pusher(
    synapse: Synapse, apns: FakeApns, tmp_path: Path
) -> None:
    keyfile, _ = write_key_files(tmp_path)
    config = write_config(tmp_path, {APP_ID: apns_app(apns, keyfile)})
    token = secrets.token_bytes(32)
    apns.script(token.hex(), OK, Reply(410, "Unregistered"))
    async with running(gateway_settings(config)) as gateway, synapse.client() as client:
        alice = await synapse.register(client, "e2e-alice", "alice-password")
        bob = await synapse.register(client, "e2e-bob", "bob-password")
        room = await alice.create_room(invite=[bob.user_id])
        await bob.join(room)
        url = f"http://127.0.0.1:{gateway.port}{NOTIFY}"
        await bob.set_pusher(url, APP_ID, b64(token), data={"format": "event_id_only"})
        assert [p["pushkey"] for p in await bob.pushers()] == [b64(token)]

        event_id = await alice.send_message(room, "hello from the homeserver")
        [pushed] = await apns.wait_for(1, timeout=PUSHER_WAIT_SECONDS)
        assert pushed.token == token.hex()
        assert pushed.header("apns-topic") == TOPIC
        body = pushed.json()
        assert (body["event_id"], body["room_id"]) == (event_id, room)
        assert body["unread_count"] >= 1
        assert "hello from the homeserver" not in pushed.body.decode()

        await alice.send_message(room, "are you still there?")
        await apns.wait_for(2, timeout=PUSHER_WAIT_SECONDS)
        assert await pushers_gone(bob), "Synapse kept the pusher after its pushkey was rejected"
    assert [r.token for r in apns.requests] == [token.hex()] * 2
