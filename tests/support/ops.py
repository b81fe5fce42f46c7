"""Helpers for the operator-facing tests: the console script as a child process, registration over
real gRPC, and a PNG reader for screenshots (zlib and struct, no imaging library)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import struct
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.ops.stats import collect_stats
from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from fakes import keys
from fakes.fake_apns import FakeApns
from fakes.webhook_receiver import Receiver
from tests.support.pipeline import Pipeline, envelope, group_topic

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60.0
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"


def command() -> list[str]:
    script = shutil.which("xmtp-push", path=str(Path(sys.executable).parent)) or shutil.which("xmtp-push")
    return [script] if script else [sys.executable, "-m", "workers.cli"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def required_tool(name: str, package: str) -> str:
    """The path of an external tool the test needs; fails (never skips) when it is missing."""
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if path is None:
        pytest.fail(
            f"`{name}` is not installed: `apt-get install -y {package}` (.ci/run installs it when missing)"
        )
    return path


def child_env(**settings: str) -> dict[str, str]:
    """This environment without any XMTP_PUSH_* variable, plus `settings` (names without the prefix)."""
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("XMTP_PUSH_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update({f"XMTP_PUSH_{name.upper()}": value for name, value in settings.items()})
    return env


def channel_env(
    database_url: str,
    *,
    apns_endpoint: str | None = None,
    apns_ca_file: str | None = None,
    fcm_endpoint: str | None = None,
    fcm_token_uri: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """Settings for a child process: loopback webhooks, and APNs and FCM when their endpoints are given."""
    settings = {
        "database_url": database_url,
        "webhook_enabled": "true",
        "webhook_allow_insecure": "true",
        "webhook_allow_private_addresses": "true",
    }
    if apns_endpoint:
        settings |= {
            "apns_key": keys.apns_key_pem(),
            "apns_key_id": "KEYID12345",
            "apns_team_id": "TEAMID1234",
            "apns_bundle_id": "org.example.app",
            "apns_endpoint": apns_endpoint,
        }
        if apns_ca_file:
            settings["apns_ca_file"] = apns_ca_file
    if fcm_endpoint:
        settings["fcm_service_account"] = keys.service_account(token_uri=fcm_token_uri or "")
        settings["fcm_endpoint"] = fcm_endpoint
    settings.update(extra)
    return child_env(**settings)


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"{' '.join(self.args)} exited {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        )


async def run_child(
    args: Sequence[str], env: dict[str, str], timeout: float = CHILD_TIMEOUT, cwd: Path = ROOT
) -> Result:
    """Run a program without blocking this event loop (servers in it keep answering); always reaped."""
    process = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        raise AssertionError(
            f"{' '.join(args)} did not finish within {timeout} s\nstdout:\n{out.decode()}\nstderr:\n{err.decode()}"
        ) from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Result(tuple(args), process.returncode, out.decode(), err.decode())


async def xmtp_push(*args: str, env: dict[str, str], timeout: float = CHILD_TIMEOUT) -> Result:
    return await run_child([*command(), *args], env, timeout)


# --- registering over gRPC -------------------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    rid: bytes
    secret: bytes
    channel: str  # apns | fcm | http
    target: str  # device token or webhook URL
    signing_key: bytes = b""


async def register(
    stub: notification_pb2_grpc.NotificationServiceStub,
    channel: str,
    target: str,
    signing_key: bytes = b"",
    topics: Sequence[bytes] = (),
) -> Registered:
    rid, secret = secrets.token_bytes(32), secrets.token_bytes(32)
    delivery = {
        "apns": {"apns": pb.ApnsDelivery(token=target)},
        "fcm": {"fcm": pb.FcmDelivery(token=target)},
        "http": {"http": pb.HttpDelivery(url=target, signing_key=signing_key)},
    }[channel]
    await stub.Register(
        pb.RegisterRequest(recipient_id=rid, recipient_secret=secret, **delivery),
        timeout=10,
    )
    if topics:
        await stub.UpdateSubscriptions(
            pb.UpdateSubscriptionsRequest(
                recipient_id=rid, recipient_secret=secret, adds=[pb.Subscription(topic=t) for t in topics]
            ),
            timeout=10,
        )
    return Registered(rid, secret, channel, target, signing_key)


# --- PNG ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    pixels: list[tuple[int, int, int]]  # RGB, row by row

    def colors(self) -> set[tuple[int, int, int]]:
        return set(self.pixels)

    def count_near(self, color: tuple[int, int, int], tolerance: int = 24) -> int:
        return sum(
            1 for p in self.pixels if all(abs(a - b) <= tolerance for a, b in zip(p, color, strict=True))
        )


def _unfilter(kind: int, line: bytearray, previous: bytearray, bpp: int) -> None:
    """Undo one scanline's filter in place (PNG spec, section 9); one loop per filter type."""
    n = len(line)
    if kind == 1:
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:
        for i in range(n):
            line[i] = (line[i] + previous[i]) & 0xFF
    elif kind == 3:
        for i in range(bpp):
            line[i] = (line[i] + (previous[i] >> 1)) & 0xFF
        for i in range(bpp, n):
            line[i] = (line[i] + ((line[i - bpp] + previous[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(bpp):
            line[i] = (line[i] + previous[i]) & 0xFF
        for i in range(bpp, n):
            a, b, c = line[i - bpp], previous[i], previous[i - bpp]
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + predictor) & 0xFF
    elif kind != 0:
        raise AssertionError(f"unknown PNG filter {kind}")


def read_png(data: bytes) -> Image:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's --screenshot writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    position, chunks, header = 8, [], b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        (crc,) = struct.unpack(">I", data[position + 8 + length : position + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
        position += 12 + length
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color_type in (2, 6) and interlace == 0, (depth, color_type, interlace)
    channels = 3 if color_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(b"".join(chunks))
    assert len(raw) == height * (stride + 1), "image data is truncated"
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for row in range(height):
        start = row * (stride + 1)
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(raw[start], line, previous, channels)
        pixels.extend(zip(line[0::channels], line[1::channels], line[2::channels], strict=True))
        previous = line
    return Image(width, height, pixels)


# --- a scripted run with deliveries on two channels -------------------------------------------------


@dataclass
class ScriptedRun:
    """What `scripted_run` did, for the assertions on stats, metrics and the status page."""

    kept: list[Registered]  # registered and still there
    gone: list[Registered]  # answered 410: deleted as dead
    topic: bytes
    # What the outcome counts of the last hour must be afterwards.
    outcomes: dict[str, dict[str, int]]
    recipients: dict[str, int]
    subscriptions: int


async def scripted_run(pipe: Pipeline, receiver: Receiver, apns: FakeApns) -> ScriptedRun:
    """Two webhooks answering 200 and one 410, one APNs token answering 200 and one 410; one envelope
    for the topic they all follow. Returns when every outcome is recorded."""
    topic = group_topic()
    ok = [receiver.endpoint([200]) for _ in range(2)]
    gone_hook = receiver.endpoint([410])
    kept = [await register(pipe.stub, "http", e.url, e.key, [topic]) for e in ok]
    gone = [await register(pipe.stub, "http", gone_hook.url, gone_hook.key, [topic])]
    kept.append(await register(pipe.stub, "apns", f"ok.{secrets.token_hex(16)}", topics=[topic]))
    gone.append(await register(pipe.stub, "apns", f"gone.{secrets.token_hex(16)}", topics=[topic]))
    await pipe.ingest_ok([envelope(topic, 42)])

    expected = {"apns": {"delivered": 1, "dead": 1}, "http": {"delivered": 2, "dead": 1}}

    async def recorded() -> bool:
        stats = await collect_stats(pipe.runtime)
        return stats.outcomes == expected and stats.recipients["http"] + stats.recipients["apns"] == 3

    deadline = time.monotonic() + 20
    while not await recorded():
        pipe.check_workers()
        if time.monotonic() > deadline:
            stats = await collect_stats(pipe.runtime)
            raise AssertionError(f"outcomes {stats.outcomes}, recipients {stats.recipients}; want {expected}")
        await asyncio.sleep(0.05)
    await pipe.settled(receiver)
    assert [len(e.requests) for e in ok] == [1, 1]
    assert len(gone_hook.requests) == pipe.runtime.settings.max_attempts  # 410 is confirmed by retrying
    assert len(apns.requests) == 2
    return ScriptedRun(kept, gone, topic, expected, {"apns": 1, "fcm": 0, "http": 2}, subscriptions=3)


# --- the compose file ---------------------------------------------------------------------------


def compose_config(project: Path, env_file: str | None, *options: str) -> tuple[int, dict[str, Any], str]:
    """`docker-compose config` of our compose file, with `env_file` as the .env beside it."""
    compose = required_tool("docker-compose", "docker-compose")
    project.mkdir(exist_ok=True)
    if env_file is not None:
        (project / ".env").write_text(env_file)
    env = {name: value for name, value in child_env().items() if name != "POSTGRES_PASSWORD"}
    args = [compose, "-f", str(COMPOSE_FILE), "--project-directory", str(project), *options, "config"]
    result = asyncio.run(run_child(args, env))
    config = yaml.safe_load(result.stdout) if result.returncode == 0 else {}
    return result.returncode, config, result.stdout + result.stderr


def example_env(**changes: str) -> str:
    """.env.example as an operator fills it in: the password set, and `changes` appended."""
    text = ENV_EXAMPLE.read_text().replace("\nPOSTGRES_PASSWORD=\n", "\nPOSTGRES_PASSWORD=pw-0f5e\n")
    return text + "".join(f"{name}={value}\n" for name, value in changes.items())
