"""Helpers for the Matrix gateway's tests: a config file for the local fakes, and a running gateway."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.core.config import Settings
from app.matrix.service import Gateway
from fakes import keys
from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from tests.support.process import Child, child, clean_env, events
from workers.server import running_gateway

NOTIFY = "/_matrix/push/v1/notify"
# The start-up line of `xmtp-push gateway`: where it listens.
SERVING = re.compile(r"serving the Matrix push gateway on (\[[^\]]+\]|[^\s:]+):(\d+)")
KEY_ID, TEAM_ID, TOPIC = "KEYID12345", "TEAMID1234", "org.example.matrix"
PROJECT = "matrix-project"


def write_key_files(folder: Path, fcm: FakeFcm | None = None) -> tuple[str, str]:
    """The APNs .p8 key and the FCM service account as files; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    keyfile, account = folder / "AuthKey.p8", folder / "service-account.json"
    keyfile.write_text(keys.apns_key_pem())
    token_uri = fcm.token_uri if fcm else "http://127.0.0.1:9/token"
    account.write_text(keys.service_account(token_uri=token_uri, project_id=PROJECT))
    return str(keyfile), str(account)


def apns_app(fake: FakeApns, keyfile: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "type": "apns",
        "keyfile": keyfile,
        "key_id": KEY_ID,
        "team_id": TEAM_ID,
        "topic": TOPIC,
        "platform": "sandbox",
        "endpoint": fake.endpoint,
        "ca_file": fake.tls.ca_file,
    }
    values.update(overrides)
    return values


def gcm_app(fake: FakeFcm, account: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "type": "gcm",
        "api_version": "v1",
        "project_id": PROJECT,
        "service_account_file": account,
        "endpoint": fake.endpoint,
    }
    values.update(overrides)
    return values


def write_config(folder: Path, apps: dict[str, Any], **sections: Any) -> str:
    path = folder / "sygnal.yaml"
    path.write_text(yaml.safe_dump({**sections, "apps": apps}, sort_keys=False))
    return str(path)


def gateway_settings(config_path: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": "sqlite+aiosqlite:///unused.db",
        "http_host": "127.0.0.1",
        "http_port": 0,
        "matrix_apps": config_path,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class RunningGateway:
    gateway: Gateway
    http: httpx.AsyncClient
    port: int

    async def notify(self, notification: dict[str, Any]) -> httpx.Response:
        return await self.http.post(NOTIFY, json={"notification": notification})


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with (
        running_gateway(settings) as (gateway, server),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http,
    ):
        yield RunningGateway(gateway, http, server.port)


def b64(token: bytes) -> str:
    return base64.b64encode(token).decode()


def device(app_id: str, pushkey: str, **data: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"app_id": app_id, "pushkey": pushkey, "pushkey_ts": 1700000000}
    entry["data"] = data
    return entry


def event_id_only(*devices: dict[str, Any], **fields: Any) -> dict[str, Any]:
    notification: dict[str, Any] = {
        "event_id": "$event:example.org",
        "room_id": "!room:example.org",
        "counts": {"unread": 2},
        "prio": "high",
        "devices": list(devices),
    }
    notification.update(fields)
    return notification


@dataclass
class GatewayProcess:
    """`xmtp-push gateway` as a child process, and a client of its HTTP port."""

    child: Child
    http: httpx.AsyncClient

    async def notify(self, notification: dict[str, Any]) -> httpx.Response:
        return await self.http.post(NOTIFY, json={"notification": notification})

    def records(self) -> list[dict[str, Any]]:
        """Its log lines so far (JSON), without the lines that are not JSON."""
        return events(self.child)


@asynccontextmanager
async def gateway_process(config_path: str, **env: str) -> AsyncIterator[GatewayProcess]:
    """`xmtp-push gateway` with `config_path` its XMTP_PUSH_MATRIX_APPS and `env` (XMTP_PUSH_*
    variables, by their whole names); stopped at the end, and it must exit 0."""
    settings = {"XMTP_PUSH_MATRIX_APPS": config_path, **env}
    async with child("gateway", ["gateway"], clean_env(**settings)) as process:
        host, port = (await process.line(SERVING)).groups()
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30) as http:
            yield GatewayProcess(process, http)
        assert await process.stop() == 0, process.output()
