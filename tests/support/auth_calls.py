"""One call of NotificationService over each transport with the given `authorization` headers, and
what came back: the test's view of whether a call was admitted (its body is garbage, so an admitted
call is refused INVALID_ARGUMENT by the method, after authentication)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import httpx

from tests.support import Api

REGISTER = "/xmtp.backend.v1.NotificationService/Register"
GARBAGE = b"\xff\xff\xff"


@dataclass(frozen=True)
class Answer:
    code: str  # the gRPC status name, or Connect's code
    message: str
    status: int = 0  # Connect's HTTP status


async def grpc_call(api: Api, values: list[str], path: str = REGISTER) -> Answer:
    metadata = tuple(("authorization", value) for value in values)
    try:
        await api.grpc_channel.unary_unary(path)(GARBAGE, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as error:
        return Answer(error.code().name, error.details() or "")
    return Answer("OK", "")


async def connect_call(
    api: Api, values: list[str], path: str = REGISTER, content_type: str = "application/proto"
) -> Answer:
    headers = [("content-type", content_type), *(("authorization", value) for value in values)]
    response = await api.http.post(path, content=GARBAGE, headers=httpx.Headers(headers))
    try:
        document = response.json()
    except ValueError:
        return Answer("", "", response.status_code)
    return Answer(document.get("code", ""), document.get("message", ""), response.status_code)


def connect_status(code: str) -> int:
    return {"unauthenticated": 401, "permission_denied": 403, "invalid_argument": 400}[code]
