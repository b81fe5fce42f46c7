"""The Connect protocol (unary) for NotificationService on the HTTP app.

`application/json` uses the proto3 JSON mapping, `application/proto` the
binary encoding. Errors are Connect error JSON with Connect's HTTP statuses.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from app.api.bodies import BodyTooLarge, BodyTooSlow, read_body
from app.api.call_quota import connect_quota
from app.api.calls import METHODS, Method, invoke
from app.api.error_details import connect_details
from app.api.legacy_calls import LEGACY_METHODS, LEGACY_SERVICE_NAME
from app.api.openapi_schema import message_schema
from app.core.errors import Code, DomainError, Throttled

JSON = "application/json"
PROTO = "application/proto"
# Connect's mapping of codes to HTTP statuses.
HTTP_STATUS = {
    Code.INVALID_ARGUMENT: 400,
    Code.FAILED_PRECONDITION: 400,
    Code.UNAUTHENTICATED: 401,
    Code.UNIMPLEMENTED: 501,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DEADLINE_EXCEEDED: 504,
}
MAX_TIMEOUT_DIGITS = 10
# As gRPC's default receive limit: the same request is refused the same way over both transports.
MAX_BODY_BYTES = 4 * 1024 * 1024
TOO_LARGE = DomainError(Code.RESOURCE_EXHAUSTED, "request body is larger than 4 MiB")
TOO_SLOW = DomainError(Code.DEADLINE_EXCEEDED, "request body did not arrive in time")
UNKNOWN_ENCODING = DomainError(Code.UNIMPLEMENTED, "content encoding is not supported")
MALFORMED = DomainError(Code.INVALID_ARGUMENT, "request is malformed")

router = APIRouter(tags=["xmtp.backend.v1.NotificationService"])
# Included only where XMTP_PUSH_LEGACY_API_ENABLED is on (app/api/main.py).
legacy_router = APIRouter(tags=[LEGACY_SERVICE_NAME])


def error_response(error: DomainError) -> Response:
    document: dict[str, Any] = {"code": error.code.value, "message": error.message}
    if error.violation is not None:
        document["details"] = connect_details(error.violation)
    body = json.dumps(document, separators=(",", ":"))
    headers = {"Retry-After": str(error.retry_after_seconds)} if isinstance(error, Throttled) else None
    return Response(body, status_code=HTTP_STATUS[error.code], media_type=JSON, headers=headers)


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _timeout_seconds(request: Request) -> float | None:
    """Connect-Timeout-Ms: at most 10 digits of milliseconds; anything else is ignored."""
    raw = request.headers.get("connect-timeout-ms", "")
    if raw.isdigit() and len(raw) <= MAX_TIMEOUT_DIGITS:
        return int(raw) / 1000
    return None


def _decompressed(body: bytes, encoding: str) -> bytes:
    """The body as sent before its Content-Encoding (gzip or none), bounded as the body itself is:
    a small gzip body may not unpack into more than MAX_BODY_BYTES."""
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise UNKNOWN_ENCODING
    unpacker = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        plain = unpacker.decompress(body, MAX_BODY_BYTES)
    except zlib.error:
        raise MALFORMED from None
    if unpacker.unconsumed_tail:
        raise TOO_LARGE
    if not unpacker.eof:
        raise MALFORMED
    return plain


def _decoder(body: bytes, content_type: str) -> Callable[[type[Message]], Message]:
    def decode(message_type: type[Message]) -> Message:
        if content_type == PROTO:
            return message_type.FromString(body)
        return json_format.Parse(body, message_type(), ignore_unknown_fields=True)

    return decode


def _render(reply: Message, content_type: str) -> Response:
    if content_type == PROTO:
        return Response(reply.SerializeToString(), media_type=PROTO)
    document = json_format.MessageToDict(reply)
    return Response(json.dumps(document, separators=(",", ":")), media_type=JSON)


def _endpoint(method: Method) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        content_type = _content_type(request)
        if content_type not in (JSON, PROTO):
            return Response(status_code=415, headers={"Accept-Post": f"{JSON}, {PROTO}"})
        runtime = request.app.state.runtime
        try:
            body = await read_body(request, MAX_BODY_BYTES, runtime.settings.request_timeout_seconds)
        except BodyTooLarge:
            return error_response(TOO_LARGE)
        except BodyTooSlow:
            return error_response(TOO_SLOW)
        try:
            body = _decompressed(body, request.headers.get("content-encoding", "").strip().lower())
            decode = _decoder(body, content_type)
            quota = connect_quota(request, request.app.state.quotas)
            reply = await invoke(runtime, method, decode, _timeout_seconds(request), quota)
        except DomainError as error:
            return error_response(error)
        return _render(reply, content_type)

    return endpoint


def _openapi(method: Method) -> dict[str, Any]:
    error = {
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            # a field violation beside the constant message (google.rpc.BadRequest)
            "details": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string"},
                        "value": {"type": "string", "format": "byte"},
                        "debug": {"type": "object"},
                    },
                },
            },
        },
        "required": ["code"],
    }
    binary = {"schema": {"type": "string", "format": "binary"}}
    request = cast(Descriptor, method.request_type.DESCRIPTOR)
    response = cast(Descriptor, method.response_type.DESCRIPTOR)
    return {
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": message_schema(request)}, PROTO: binary},
        },
        "responses": {
            "200": {
                "description": f"{response.name}",
                "content": {JSON: {"schema": message_schema(response)}, PROTO: binary},
            },
            "default": {"description": "Connect error", "content": {JSON: {"schema": error}}},
        },
    }


def _add_routes(target: APIRouter, methods: Iterable[Method]) -> None:
    for method in methods:
        target.add_api_route(
            method.path,
            _endpoint(method),
            methods=["POST"],
            name=method.name,
            summary=f"{method.service.rsplit('.', 1)[-1]}.{method.name} (Connect unary)",
            openapi_extra=_openapi(method),
            response_class=Response,
            responses={},
        )


_add_routes(router, METHODS.values())
_add_routes(legacy_router, LEGACY_METHODS.values())
