"""SQLite in trouble, on the real process: its file (which holds webhook signing keys) is created
readable by its owner alone, and a full disk is told as such ("the database's disk is full", not
"unreachable") while /readyz answers 503 until writes succeed again. The full disk is real: the
`api` process runs on a small tmpfs of its own, filled and then emptied while it runs."""

from __future__ import annotations

import asyncio
import base64
import errno
import os
import re
import secrets
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cli import run, sqlite_url
from tests.support.ops import child_env, free_port, required_tool
from tests.support.process import START_SECONDS, child

pytestmark = pytest.mark.slow

REGISTER = "/xmtp.backend.v1.NotificationService/Register"
DISK_FULL = re.compile(r"XMTP_PUSH_DATABASE_URL: the database's disk is full")


def test_the_sqlite_file_is_created_readable_by_its_owner_alone(tmp_path: Path) -> None:
    for args, name in ((["migrate"], "migrated.db"), (["config", "check", "--role", "api"], "checked.db")):
        path = tmp_path / name
        result = run(args, child_env(database_url=sqlite_url(path), webhook_enabled="true"), tmp_path)
        assert result.returncode in (0, 7), result  # 7: `config check` on a database not migrated
        files = [path, *tmp_path.glob(f"{name}-*")]
        assert path.exists()
        assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {
            f.name: "0o600" for f in files
        }


def body() -> dict[str, object]:
    return {
        "recipientId": base64.b64encode(secrets.token_bytes(32)).decode(),
        "recipientSecret": base64.b64encode(secrets.token_bytes(32)).decode(),
        "http": {"url": "http://127.0.0.1:9/hook", "signingKey": base64.b64encode(b"k" * 32).decode()},
    }


async def ready(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("the API never became ready")


async def test_a_full_disk_is_told_as_such_and_readyz_answers_503_while_writes_fail(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    env = child_env(
        database_url=sqlite_url(disk / "full.db"),
        webhook_enabled="true",
        webhook_allow_insecure="true",
        webhook_allow_private_addresses="true",
        http_port=str(free_port()),
        grpc_port=str(free_port()),
    )
    base_url = f"http://127.0.0.1:{env['XMTP_PUSH_HTTP_PORT']}"
    async with child("api", ["api"], env, wrapper=on_a_small_disk(disk)) as api:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            await ready(client)
            ballast = f"/proc/{api.process.pid}/root{disk}/ballast"  # the disk as the process sees it
            await asyncio.to_thread(fill, ballast)
            for _ in range(100):
                answer = await client.post(REGISTER, json=body())
                if answer.status_code != 200:
                    break
            assert answer.status_code == 503, answer.text  # UNAVAILABLE, over Connect
            await api.line(DISK_FULL)
            assert not [line for line in api.lines if "unreachable" in line], api.output()
            readiness = await client.get("/readyz")
            assert readiness.status_code == 503, readiness.text
            assert readiness.json()["checks"]["database"] == "unavailable"

            await asyncio.to_thread(os.unlink, ballast)
            assert (await client.post(REGISTER, json=body())).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
        assert await api.stop() == 0, api.output()


def on_a_small_disk(folder: Path) -> list[str]:
    """A wrapper running the command, migrated first, with a small file system of its own mounted
    on `folder` (a tmpfs, in a user and mount namespace: no privilege needed)."""
    unshare = required_tool("unshare", "util-linux")
    script = 'mount -t tmpfs -o size=2m tmpfs "$0" && "$1" migrate > /dev/null && exec "$@"'
    return [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, str(folder)]


def fill(path: str) -> None:
    """Write to `path` until its file system has no room left."""
    chunk = b"\0" * 64 * 1024
    with open(path, "wb", buffering=0) as ballast:
        try:
            while True:
                ballast.write(chunk)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
