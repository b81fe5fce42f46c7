"""The Marmot server's relay connections against a real relay on loopback: the inbox relay list, the
subscription, backlog before EOSE, NIP-42 AUTH, a relay restarted mid-run, and the watchdog.

What a live gift wrap becomes is tests/test_marmot_triggers.py; here the server hands live wraps to a
recorder, so these tests need nothing of the unwrapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.core.config import Settings
from app.delivery.registry import ProviderRegistry
from app.marmot.events import verify_event
from app.marmot.keys import ServerKey
from app.marmot.relay_session import (
    BACKDATE_SECONDS,
    INBOX_RELAYS_KIND,
    Reaction,
    RelaySession,
    relay_host,
    relay_names,
)
from tests.support import eventually
from tests.support.marmot import Relay, SilentProxy, event_dict, gift_wrap, running_relay
from workers.marmot_server import MarmotServer


class Recorder:
    """Takes the live gift wraps a server hands over."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def handle(self, event: dict[str, Any]) -> object:
        self.events.append(event)
        return None


def connected_gauge() -> float:
    return REGISTRY.get_sample_value("xmtp_push_marmot_relays_connected") or 0.0


@contextlib.asynccontextmanager
async def serving(*relay_urls: str, watchdog: float = 60.0) -> AsyncIterator[tuple[MarmotServer, Recorder]]:
    key = ServerKey(secrets.token_bytes(32))
    settings = Settings(
        marmot_secret_key=key.secret.hex(),
        marmot_relays=",".join(relay_urls),
        marmot_relay_watchdog_seconds=watchdog,
    )
    recorder = Recorder()
    server = MarmotServer(settings, key, ProviderRegistry(), recorder)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        yield server, recorder
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def pubkey_of(server: MarmotServer) -> str:
    return server._key.public_hex


async def subscribed(server: MarmotServer, *numbers: int, timeout: float = 10.0) -> None:
    await eventually(lambda: server.subscribed >= set(numbers or {1}), timeout, "the subscription")


async def test_on_connect_the_server_publishes_its_signed_inbox_relay_list() -> None:
    async with (
        running_relay() as first,
        running_relay() as second,
        serving(first.url, second.url) as (server, _),
    ):
        await subscribed(server, 1, 2)
        for relay in (first, second):
            (event,) = await relay.query({"kinds": [INBOX_RELAYS_KIND], "authors": [pubkey_of(server)]})
            assert verify_event(event)
            assert event["tags"] == [["relay", first.url], ["relay", second.url]]
            assert event["content"] == ""


async def test_stored_wraps_are_not_handed_over_and_live_ones_are() -> None:
    async with running_relay() as relay:
        key = ServerKey(secrets.token_bytes(32))
        # Stored before the server subscribes, within the filter's 48 hours.
        await relay.publish(gift_wrap(key.public_hex, "stored"))
        settings = Settings(marmot_secret_key=key.secret.hex(), marmot_relays=relay.url)
        recorder = Recorder()
        server = MarmotServer(settings, key, ProviderRegistry(), recorder)
        stop = asyncio.Event()
        task = asyncio.create_task(server.run(stop))
        try:
            await subscribed(server)
            live = gift_wrap(key.public_hex, "live")
            await relay.publish(live)
            await eventually(lambda: len(recorder.events) == 1, what="the live wrap")
            await asyncio.sleep(0.2)
            assert recorder.events == [event_dict(live)]
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


def test_events_before_eose_are_backlog_for_a_relay_that_sends_stored_ones() -> None:
    """This relay honours `limit` 0; others send stored events before EOSE all the same."""
    key = ServerKey(secrets.token_bytes(32))
    session = RelaySession("ws://relay.example", key, ["ws://relay.example"])
    inbox, request = session.opening()
    assert json.loads(inbox)[1]["kind"] == INBOX_RELAYS_KIND
    sub = json.loads(request)[1]
    wrap = {"id": "00" * 32, "kind": 1059}
    assert session.receive(json.dumps(["EVENT", sub, wrap])).backlog
    assert session.receive(json.dumps(["EVENT", "another", wrap])) == Reaction()
    assert session.receive(json.dumps(["EOSE", sub])) == Reaction()
    live = session.receive(json.dumps(["EVENT", sub, wrap]))
    assert live.trigger == wrap and not live.backlog
    again = json.loads(session._subscribe())[
        1
    ]  # a fresh id on every subscription: live again only after its EOSE
    assert again != sub
    assert session.receive(json.dumps(["EVENT", again, wrap])).backlog
    assert session.receive(json.dumps(["EVENT", sub, wrap])) == Reaction()


def test_a_closed_subscription_reconnects_unless_it_waits_for_auth() -> None:
    key = ServerKey(secrets.token_bytes(32))
    session = RelaySession("ws://relay.example", key, ["ws://relay.example"])
    sub = json.loads(session.opening()[1])[1]
    waiting = session.receive(json.dumps(["CLOSED", sub, "auth-required: sign in"]))
    assert not waiting.reconnect and waiting.send == []
    (answer,) = session.receive(json.dumps(["AUTH", "challenge-1"])).send
    auth = json.loads(answer)[1]
    assert verify_event(auth) and auth["kind"] == 22242
    assert auth["tags"] == [["relay", "ws://relay.example"], ["challenge", "challenge-1"]]
    (resubscribe,) = session.receive(json.dumps(["OK", auth["id"], True, ""])).send
    assert json.loads(resubscribe)[0] == "REQ" and json.loads(resubscribe)[1] != sub
    closed = session.receive(json.dumps(["CLOSED", json.loads(resubscribe)[1], "error: shutting down"]))
    assert closed.reconnect
    for junk in ("", "{}", "[]", "[1]", '["EVENT"]', '["OK"]', '["AUTH", 5]', "[" * 10_000):
        assert session.receive(junk) == Reaction()


async def test_gift_wraps_to_another_key_are_not_received() -> None:
    async with running_relay() as relay, serving(relay.url) as (server, recorder):
        await subscribed(server)
        await relay.publish(gift_wrap(ServerKey(secrets.token_bytes(32)).public_hex, "not ours"))
        mine = gift_wrap(pubkey_of(server), "ours")
        await relay.publish(mine)
        await eventually(lambda: len(recorder.events) == 1)
        await asyncio.sleep(0.2)
        assert recorder.events == [event_dict(mine)]


async def test_auth_required_relay_is_answered_and_the_subscription_sent_again() -> None:
    """The relay CLOSES the subscription with auth-required: until we authenticate (NIP-42); the
    server answers the challenge with a signed kind 22242 and subscribes again once accepted."""
    async with running_relay(auth_dm=True) as relay, serving(relay.url) as (server, recorder):
        await subscribed(server)
        wrap = gift_wrap(pubkey_of(server), "behind auth")
        await relay.publish(wrap)
        await eventually(lambda: len(recorder.events) == 1, what="the wrap behind AUTH")
        assert recorder.events == [event_dict(wrap)]


@pytest.mark.slow
async def test_a_relay_restarted_mid_run_is_reconnected_and_later_wraps_arrive() -> None:
    relay = await Relay().start()
    try:
        async with serving(relay.url) as (server, recorder):
            await subscribed(server)
            assert connected_gauge() >= 1
            relay.stop()
            await eventually(lambda: not server.connected, what="the lost connection")
            await asyncio.sleep(0.5)
            await relay.start()  # the same port, an empty store
            await subscribed(server, timeout=15)
            wrap = gift_wrap(pubkey_of(server), "after the restart")
            await relay.publish(wrap)
            await eventually(lambda: recorder.events == [event_dict(wrap)], what="the later wrap")
    finally:
        relay.stop()


def relay_up() -> float | None:
    return REGISTRY.get_sample_value("xmtp_push_dependency_up", {"dependency": "relay"})


@pytest.mark.slow
async def test_the_relay_dependency_gauge_is_1_while_a_relay_is_connected_and_0_without() -> None:
    relay = await Relay().start()
    try:
        async with serving(relay.url) as (server, _):
            await subscribed(server)
            assert relay_up() == 1
            relay.stop()
            await eventually(lambda: not server.connected, what="the lost connection")
            assert relay_up() == 0
    finally:
        relay.stop()


@pytest.mark.slow
async def test_a_silent_relay_is_reconnected_after_the_watchdog() -> None:
    async with (
        running_relay() as relay,
        SilentProxy(relay.port or 0) as proxy,
        serving(proxy.url, watchdog=1.0) as (server, recorder),
    ):
        await subscribed(server)
        assert proxy.connections == 1
        proxy.silent = True  # pings go unanswered, nothing arrives
        await eventually(lambda: not server.connected, timeout=5, what="the watchdog")
        proxy.silent = False
        await eventually(lambda: proxy.connections >= 2 and server.subscribed == {1}, timeout=10)
        wrap = gift_wrap(pubkey_of(server), "after the watchdog")
        await relay.publish(wrap)
        await eventually(lambda: recorder.events == [event_dict(wrap)], what="the later wrap")


async def test_the_filter_reaches_back_48_hours_with_limit_zero() -> None:
    from app.marmot.relay_session import subscription_filter

    assert subscription_filter("ab" * 32, 1_000_000) == {
        "kinds": [1059],
        "#p": ["ab" * 32],
        "since": 1_000_000 - BACKDATE_SECONDS,
        "limit": 0,
    }
    assert BACKDATE_SECONDS == 172_800


@pytest.mark.parametrize("relays", ["ws://", "http://relay.example", "wss://relay.example, ftp://x"])
def test_relay_urls_are_checked(relays: str) -> None:
    from app.core.config import SettingsError, load_settings

    with pytest.raises(SettingsError) as error:
        load_settings(marmot_relays=relays)
    assert "XMTP_PUSH_MARMOT_RELAYS" in str(error.value)
    assert "example" not in str(error.value)


def test_a_relay_is_named_by_its_host_and_port_alone() -> None:
    urls = [
        "wss://relay.example.org",
        "ws://user:secret@127.0.0.1:7000/inbox?token=x",
        "wss://[2001:db8::1]:443/a",
        "wss://inbox.example.net/one",
        "wss://inbox.example.net/two",
    ]
    assert [relay_host(url) for url in urls[:3]] == [
        "relay.example.org",
        "127.0.0.1:7000",
        "[2001:db8::1]:443",
    ]
    assert relay_names(urls) == [
        "relay.example.org",
        "127.0.0.1:7000",
        "[2001:db8::1]:443",
        "inbox.example.net #4",
        "inbox.example.net #5",
    ]
