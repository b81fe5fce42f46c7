"""The `xmtp-push` console script as a blocking subprocess: a one-shot command, or a server that is
always gone when its block ends, with `dev`'s settings on free ports."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from tests.support.ops import command
from tests.support.process import clean_env

START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
RUN_TIMEOUT = 60.0


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


@contextmanager
def started(args: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """A running subprocess that is always gone when the block ends."""
    process = subprocess.Popen(
        [*command(), *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        with suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=STOP_TIMEOUT)


def output_of(process: subprocess.Popen[str]) -> str:
    """Whatever the (already exited or killed) process wrote, for assertion messages."""
    if process.poll() is None:
        process.kill()
    try:
        out, err = process.communicate(timeout=STOP_TIMEOUT)
    except (subprocess.TimeoutExpired, ValueError):
        return "<no output>"
    return f"stdout:\n{out}\nstderr:\n{err}"


def wait_healthy(process: subprocess.Popen[str], http_port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"xmtp-push exited early with {process.returncode}\n{output_of(process)}")
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"xmtp-push did not answer /healthz within {START_TIMEOUT}s\n{output_of(process)}")


def stop(process: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, str, str]:
    process.send_signal(sig)
    try:
        out, err = process.communicate(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=STOP_TIMEOUT)
        pytest.fail(f"xmtp-push did not exit within {STOP_TIMEOUT}s of {sig.name}\nstderr:\n{err}")
    return process.returncode, out, err


def dev_env(tmp_path: Path, http_port: int, grpc_port: int, **extra: str) -> dict[str, str]:
    settings = {
        "XMTP_PUSH_DATABASE_URL": sqlite_url(tmp_path / "dev.db"),
        "XMTP_PUSH_HTTP_HOST": "127.0.0.1",
        "XMTP_PUSH_HTTP_PORT": str(http_port),
        "XMTP_PUSH_GRPC_HOST": "127.0.0.1",
        "XMTP_PUSH_GRPC_PORT": str(grpc_port),
        "XMTP_PUSH_WEBHOOK_ENABLED": "true",
        "XMTP_PUSH_WEBHOOK_ALLOW_INSECURE": "true",
        "XMTP_PUSH_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
    }
    return clean_env(**{**settings, **extra})
