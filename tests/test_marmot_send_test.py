"""`xmtp-push marmot send-test` as a real subprocess: a trigger built with our own token encryption and
gift wrap, published to the local relay of docs/marmot.md's recipe (its script, as the page gives it) and
pushed by a running `xmtp-push marmot`; a relay's refusal, an unreachable relay and bad arguments, each
with its exit code and one line on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import textwrap
from collections.abc import AsyncIterator

import pytest
from aiohttp import WSMsgType, web

from app.marmot import secp
from app.marmot.keys import ServerKey
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support.marmot import APNS_TOKEN, FCM_TOKEN, fakes, marmot_env  # noqa: F401  (fixtures)
from tests.support.ops import ROOT, command, free_port
from tests.support.process import child, clean_env

# Each test here runs the product end to end: a second or more.
pytestmark = pytest.mark.slow

RUN_SECONDS = 60.0
GUIDE = ROOT / "docs" / "marmot.md"
RELAY_SCRIPT = re.compile(r"^   cat > local-relay\.py <<'EOF'\n(.*?)^   EOF$", re.M | re.S)
RELAY_AT = re.compile(rb"^relay at ws://127\.0\.0\.1:(\d+)$")


def relay_script(port: int) -> str:
    """docs/marmot.md's local relay script, on `port` rather than its 7777."""
    found = RELAY_SCRIPT.search(GUIDE.read_text(encoding="utf-8"))
    assert found, "docs/marmot.md has no local-relay.py script"
    script = textwrap.dedent(found.group(1))
    assert ".port(7777)" in script
    return script.replace(".port(7777)", f".port({port})")


@contextlib.asynccontextmanager
async def docs_relay() -> AsyncIterator[str]:
    """The guide's relay running (nostr-sdk at the version the guide pins, which the tests use); its URL."""
    pin = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if "nostr-sdk==" in line)
    assert pin.strip().strip('",') in GUIDE.read_text(encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", relay_script(free_port()), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), RUN_SECONDS)
        found = RELAY_AT.match(line.strip())
        assert found, line
        yield f"ws://127.0.0.1:{found.group(1).decode()}"
    finally:
        process.kill()
        await process.wait()


async def send_test(*args: str) -> tuple[int, str, str]:
    """`xmtp-push marmot send-test ARGS` without any setting: exit code, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        *command(),
        "marmot",
        "send-test",
        *args,
        env=clean_env(),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), RUN_SECONDS)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("platform", ["apns", "fcm"])
async def test_a_trigger_goes_end_to_end_through_the_guides_local_relay(
    platform: str, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    key, http_port = ServerKey(secp.fresh_secret()), free_port()
    token = {"apns": APNS_TOKEN, "fcm": FCM_TOKEN}[platform]
    async with docs_relay() as relay:
        host = relay.removeprefix("ws://")
        env = clean_env(**marmot_env(key, relay, http_port, apns, fcm))
        async with child("marmot", ["marmot"], env) as server:
            await server.line(re.compile(rf"relay {re.escape(host)}: subscribed"))
            code, out, err = await send_test(
                "--relay", relay, "--platform", platform, "--token", token, "--server", key.npub
            )
            assert code == 0, err
            assert (
                out
                == f"relay {host} accepted the trigger: one {platform} token, gift-wrapped to {key.npub}\n"
            )
            fake = apns if platform == "apns" else fcm
            (request,) = await fake.wait_for(1)
            assert request.token == token
            assert await server.stop() == 0, server.output()
    assert token not in out + err


@contextlib.asynccontextmanager
async def refusing_relay(words: str) -> AsyncIterator[int]:
    """A relay that answers every EVENT with OK false and `words`; its port."""

    async def relay(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type is WSMsgType.TEXT and json.loads(message.data)[0] == "EVENT":
                event = json.loads(message.data)[1]
                await ws.send_str(json.dumps(["NOTICE", "hello"]))
                await ws.send_str(json.dumps(["OK", event["id"], False, words]))
        return ws

    app = web.Application()
    app.router.add_get("/", relay)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def test_a_refusal_is_said_by_its_prefix_and_exits_1() -> None:
    server = ServerKey(secp.fresh_secret())
    async with refusing_relay("blocked: pubkey 1234abcd is banned") as port:
        code, out, err = await send_test(
            "--relay",
            f"ws://127.0.0.1:{port}",
            "--platform",
            "apns",
            "--token",
            APNS_TOKEN,
            "--server",
            server.public_hex,
        )
    assert code == 1, err
    assert out == f"relay 127.0.0.1:{port} refused the trigger (blocked)\n"
    assert "banned" not in out + err


async def test_an_unreachable_relay_exits_1() -> None:
    port = free_port()
    code, out, _ = await send_test(
        "--relay",
        f"wss://user:pw@127.0.0.1:{port}/x",
        "--platform",
        "fcm",
        "--token",
        FCM_TOKEN,
        "--server",
        ServerKey(secp.fresh_secret()).npub,
    )
    assert code == 1
    assert out.startswith(f"relay 127.0.0.1:{port} could not be reached (") and out.count("\n") == 1
    assert "pw" not in out


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("--server", "npub1notakey"),
        ("--server", "ff" * 32),  # no point of the curve has this X
        ("--relay", "https://relay.example"),
        ("--token", "not-hex"),
    ],
)
async def test_a_bad_argument_exits_2_naming_it(argument: str, value: str) -> None:
    args = {
        "--relay": "ws://127.0.0.1:9",
        "--platform": "apns",
        "--token": APNS_TOKEN,
        "--server": ServerKey(secp.fresh_secret()).npub,
    }
    args[argument] = value
    code, out, err = await send_test(*(part for pair in args.items() for part in pair))
    assert code == 2 and out == ""
    assert f"xmtp-push: invalid argument: {argument}: " in err
    assert value not in err
