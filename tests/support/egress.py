"""Helpers for the egress proxy tests: HTTPS fakes of every provider, a Matrix gateway process
configured for them, and the environment that makes the child trust their certificate."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fakes.fake_apns import FakeApns
from fakes.fake_fcm import FakeFcm
from fakes.fake_webpush import FakeWebPush, Subscription
from fakes.tls import TlsFiles
from tests.support.matrix import (
    NOTIFY,
    apns_app,
    device,
    event_id_only,
    gcm_app,
    write_config,
    write_key_files,
)
from tests.support.ops import child_env, free_port
from tests.support.process import Child, child, wait_answering

PROXY_VARIABLES = {"HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY"}
SERVING = re.compile(r"serving the Matrix push gateway on \S+:(\d+)")


@dataclass
class Providers:
    """The HTTPS fakes: APNs, FCM with its token endpoint, a Web Push service named `localhost`."""

    tls: TlsFiles
    apns: FakeApns
    fcm: FakeFcm
    webpush: FakeWebPush

    def ports(self) -> dict[str, int]:
        return {"apns": self.apns.port, "fcm": self.fcm.port, "webpush": self.webpush.port}


def provider_env(tls: TlsFiles, **variables: str) -> dict[str, str]:
    """A child's environment trusting the fakes' CA (aiohttp and httpx by SSL_CERT_FILE, requests by
    REQUESTS_CA_BUNDLE), with no proxy variable of this one's, plus `variables` as given."""
    env = {k: v for k, v in child_env().items() if k.upper() not in PROXY_VARIABLES}
    env |= {"SSL_CERT_FILE": tls.ca_file, "REQUESTS_CA_BUNDLE": tls.ca_file}
    return env | variables


def vapid_key_file(folder: Path) -> str:
    path = folder / "vapid.pem"
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(path)


def gateway_config(folder: Path, providers: Providers, *, only: str | None = None, **sections: Any) -> str:
    """A sygnal.yaml with one app per provider (org.ios, org.android, org.web), or `only` that one,
    and `sections`."""
    keyfile, account = write_key_files(folder, providers.fcm)
    web = {
        "type": "webpush",
        "vapid_private_key": vapid_key_file(folder),
        "vapid_contact_email": "ops@example.org",
    }
    apps = {
        "org.ios": apns_app(providers.apns, keyfile),
        "org.android": gcm_app(providers.fcm, account),
        "org.web": web,
    }
    if only is not None:
        apps = {only: apps[only]}
    return write_config(folder, apps, **sections)


def every_device(subscription: Subscription) -> dict[str, Any]:
    """A notification for one device of each app."""
    keys = subscription.keys
    return event_id_only(
        device("org.ios", secrets.token_hex(32)),
        device("org.android", f"ok.{secrets.token_hex(8)}"),
        {
            "app_id": "org.web",
            "pushkey": subscription.endpoint,
            "pushkey_ts": 1700000000,
            "data": {"p256dh": keys.p256dh, "auth": keys.auth},
        },
    )


@dataclass
class GatewayChild:
    process: Child
    port: int

    async def notify(self, notification: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"http://127.0.0.1:{self.port}{NOTIFY}"
            return await client.post(url, json={"notification": notification})

    def output(self) -> str:
        return "\n".join(self.process.lines)


@asynccontextmanager
async def gateway_process(config: str, env: dict[str, str]) -> AsyncIterator[GatewayChild]:
    """`xmtp-push gateway` over `config`, loopback Web Push endpoints allowed, serving."""
    port = free_port()
    settings = {
        "XMTP_PUSH_MATRIX_APPS": config,
        "XMTP_PUSH_HTTP_PORT": str(port),
        "XMTP_PUSH_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
    }
    async with child("gateway", ["gateway"], env | settings) as process:
        await process.line(SERVING)
        await wait_answering(f"http://127.0.0.1:{port}/healthz")
        yield GatewayChild(process, port)
