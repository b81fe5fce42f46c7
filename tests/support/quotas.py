"""Calls for the quota tests: one request over gRPC or Connect (proto) with the headers a caller or its
proxy sends, and what came back, Connect's Retry-After included. `client` is anything with a gRPC
channel and an HTTP client on the API (a running Api, or a child process's ports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

NOTIFICATIONS = "/xmtp.backend.v1.NotificationService/"
LEGACY = "/notifications.v1.Notifications/"
TRANSPORTS = ("grpc", "connect")
THROTTLED = "too many requests; retry later"


@dataclass(frozen=True)
class Answer:
    code: str  # "ok", or the error's code as Connect names it (unavailable)
    message: str = ""
    status: int = 200  # Connect's HTTP status (0 over gRPC)
    retry_after: str | None = None  # Connect's Retry-After

    @property
    def throttled(self) -> bool:
        return self.code == "unavailable" and self.message == THROTTLED


async def send(
    client: Any, transport: str, path: str, request: Message, headers: dict[str, str] | None = None
) -> Answer:
    headers = headers or {}
    if transport == "grpc":
        rpc = client.grpc_channel.unary_unary(
            path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b
        )
        try:
            await rpc(request, metadata=tuple(headers.items()), timeout=10)
        except grpc.aio.AioRpcError as error:
            return Answer(error.code().name.lower(), error.details() or "", 0)
        return Answer("ok", status=0)
    response = await client.http.post(
        path, content=request.SerializeToString(), headers={"content-type": "application/proto", **headers}
    )
    if response.status_code == 200:
        return Answer("ok")
    document = response.json()
    return Answer(
        document.get("code", ""), document.get("message", ""), response.status_code,
        response.headers.get("retry-after"),
    )  # fmt: skip
