"""A real Synapse homeserver for end-to-end tests: `matrix-synapse` from PyPI in its own virtualenv
(`make synapse`, which `make test` runs first: its pins are not ours), SQLite, on loopback.

`synapse` (a pytest fixture, one homeserver per session) writes a config (no federation, a shared
registration secret, rate limits out of the way, loopback allowed as a push gateway address, which
Synapse refuses by default), starts it on a free port and waits for it. `MatrixUser` holds what a
test does as one user: register, log in, create and join rooms, send messages, set and list pushers.
Without the virtualenv the fixture fails naming the make target: the test never skips.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_NAME = ".synapse-venv"  # `make synapse` creates it
SERVER_NAME = "synapse.test"
START_SECONDS = 90.0  # a first start creates the SQLite schema
_transactions = itertools.count(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def synapse_venvs() -> list[Path]:
    """Where Synapse's virtualenv is looked for: XMTP_PUSH_TEST_SYNAPSE_VENV when set; else this
    checkout's, then (in a git worktree) the main checkout's, so worktrees can share one."""
    if os.environ.get("XMTP_PUSH_TEST_SYNAPSE_VENV"):
        return [Path(os.environ["XMTP_PUSH_TEST_SYNAPSE_VENV"])]
    venvs = [ROOT / VENV_NAME]
    common = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    if common.returncode == 0 and common.stdout.strip():
        venvs.append(Path(common.stdout.strip()).parent / VENV_NAME)
    return venvs


def synapse_python() -> Path:
    venvs = synapse_venvs()
    for venv in venvs:
        if (venv / "bin" / "python").exists():
            return venv / "bin" / "python"
    pytest.fail(
        f"Synapse is not installed (looked in {', '.join(map(str, venvs))}): run `make synapse` (make "
        "test and make check run it first), or point XMTP_PUSH_TEST_SYNAPSE_VENV at a virtualenv with "
        "matrix-synapse",
        pytrace=False,
    )


def homeserver_config(folder: Path, port: int, shared_secret: str) -> dict[str, Any]:
    """Synapse's config: loopback only, SQLite, no federation, nothing slow or rate-limited."""
    unlimited = {"per_second": 10_000, "burst_count": 10_000}
    return {
        "server_name": SERVER_NAME,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(folder / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(folder / "homeserver.db")}},
        "log_config": str(folder / "log.yaml"),
        "media_store_path": str(folder / "media"),
        "signing_key_path": str(folder / "signing.key"),
        "registration_shared_secret": shared_secret,
        "enable_registration": False,
        "report_stats": False,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        # No federation: no other server is contacted, and none is trusted for keys.
        "federation_domain_whitelist": [],
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        # Synapse refuses outbound requests to private addresses, push gateways included.
        "ip_range_whitelist": ["127.0.0.1/32"],
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "enable_metrics": False,
        "rc_message": unlimited,
        "rc_registration": unlimited,
        "rc_login": {"address": unlimited, "account": unlimited, "failed_attempts": unlimited},
        "rc_joins": {"local": unlimited, "remote": unlimited},
        "rc_invites": {"per_room": unlimited, "per_user": unlimited, "per_issuer": unlimited},
        "rc_room_creation": unlimited,
    }


LOG_CONFIG = {
    "version": 1,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"level": "WARNING", "handlers": ["stderr"]},
    # The pusher's attempts and their failures: what a failing end-to-end test wants to see.
    "loggers": {"synapse.push": {"level": "INFO"}},
    "disable_existing_loggers": False,
}


@dataclass
class Synapse:
    base_url: str
    shared_secret: str
    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return (self.folder / "synapse.log").read_text(errors="replace")

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=20.0, trust_env=False)

    async def register(self, client: httpx.AsyncClient, username: str, password: str) -> MatrixUser:
        """A user made through the shared-secret admin registration, logged in."""
        nonce = (await _ok(client.get("/_synapse/admin/v1/register")))["nonce"]
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join(part.encode() for part in (nonce, username, password, "notadmin")))
        body = {"nonce": nonce, "username": username, "password": password, "admin": False}
        await _ok(client.post("/_synapse/admin/v1/register", json={**body, "mac": mac.hexdigest()}))
        return await MatrixUser.log_in(client, username, password)


@dataclass
class MatrixUser:
    client: httpx.AsyncClient
    user_id: str
    access_token: str

    @classmethod
    async def log_in(cls, client: httpx.AsyncClient, username: str, password: str) -> MatrixUser:
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": username}}
        answer = await _ok(client.post("/_matrix/client/v3/login", json={**body, "password": password}))
        return cls(client, answer["user_id"], answer["access_token"])

    @property
    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.access_token}"}

    async def create_room(self, invite: list[str] | None = None) -> str:
        body = {"preset": "private_chat", "invite": invite or []}
        answer = await _ok(self.client.post("/_matrix/client/v3/createRoom", json=body, headers=self._auth))
        return str(answer["room_id"])

    async def join(self, room_id: str) -> None:
        await _ok(self.client.post(f"/_matrix/client/v3/join/{room_id}", json={}, headers=self._auth))

    async def send_message(self, room_id: str, text: str) -> str:
        """The event id of a new m.room.message."""
        path = f"/_matrix/client/v3/rooms/{room_id}/send/m.room.message/t{next(_transactions)}"
        body = {"msgtype": "m.text", "body": text}
        return str((await _ok(self.client.put(path, json=body, headers=self._auth)))["event_id"])

    async def set_pusher(
        self, url: str, app_id: str, pushkey: str, *, data: dict[str, Any] | None = None
    ) -> None:
        """An `http` pusher at a gateway's notify URL; `data` beyond the url (format, ...)."""
        body = {
            "kind": "http",
            "app_id": app_id,
            "pushkey": pushkey,
            "app_display_name": "xmtp-push test",
            "device_display_name": "test device",
            "lang": "en",
            "data": {"url": url, **(data or {})},
        }
        await _ok(self.client.post("/_matrix/client/v3/pushers/set", json=body, headers=self._auth))

    async def pushers(self) -> list[dict[str, Any]]:
        answer = await _ok(self.client.get("/_matrix/client/v3/pushers", headers=self._auth))
        return list(answer["pushers"])


async def _ok(request: Any) -> dict[str, Any]:
    response: httpx.Response = await request
    if response.status_code != 200:
        raise AssertionError(f"{response.request.method} {response.request.url.path}: {response.status_code}")
    answer: dict[str, Any] = response.json()
    return answer


def start_synapse(folder: Path) -> Synapse:
    python = synapse_python()
    port, shared_secret = free_port(), secrets.token_hex(16)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "media").mkdir(exist_ok=True)
    config_path = folder / "homeserver.yaml"
    config_path.write_text(yaml.safe_dump(homeserver_config(folder, port, shared_secret)))
    (folder / "log.yaml").write_text(yaml.safe_dump(LOG_CONFIG))
    # Synapse's signing key file: algorithm, version and the unpadded base64 of an ed25519 seed.
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    (folder / "signing.key").write_text(f"ed25519 a_test {seed}\n")
    environment = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    environment["no_proxy"] = "*"  # the gateway is on loopback
    log = (folder / "synapse.log").open("wb")
    process = subprocess.Popen(
        [str(python), "-m", "synapse.app.homeserver", "--config-path", str(config_path)],
        cwd=folder,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        start_new_session=True,
    )
    synapse = Synapse(f"http://127.0.0.1:{port}", shared_secret, folder, process)
    _wait_until_up(synapse)
    return synapse


def _wait_until_up(synapse: Synapse) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if synapse.process.poll() is not None:
            raise RuntimeError(f"Synapse exited ({synapse.process.returncode}):\n{synapse.log[-4000:]}")
        try:
            if httpx.get(f"{synapse.base_url}/health", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_synapse(synapse)
    raise RuntimeError(f"Synapse did not answer within {START_SECONDS:.0f} s:\n{synapse.log[-4000:]}")


def stop_synapse(synapse: Synapse) -> None:
    if synapse.process.poll() is None:
        os.killpg(synapse.process.pid, signal.SIGTERM)
        try:
            synapse.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(synapse.process.pid, signal.SIGKILL)
            synapse.process.wait()


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    server = start_synapse(tmp_path_factory.mktemp("synapse"))
    try:
        yield server
    finally:
        stop_synapse(server)
        if sys.exc_info()[0] is not None:
            print(server.log[-4000:])
