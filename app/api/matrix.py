"""POST /_matrix/push/v1/notify: the Matrix Push Gateway API, answered as Sygnal answers it.

200 `{"rejected": [...]}`; 400 M_NOT_JSON or M_BAD_JSON; 413 M_TOO_LARGE over 512 KiB (declared
or streamed); 502 when a device failed for a reason that is not its token's; 404 and 405
M_UNRECOGNIZED for other paths and methods under /_matrix/, and for the route itself when no
apps are configured (XMTP_PUSH_MATRIX_APPS). GET /health: 200 with an empty body, as Sygnal answers
it, so probes set up for Sygnal keep working.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.bodies import BodyTooLarge, collect_chunks, content_length, declared_length
from app.api.read_slots import ReadSlots
from app.core.metrics import matrix_notifications_total, matrix_notify_seconds
from app.matrix.notification import BadNotification, parse_notification
from app.matrix.service import Gateway

NOTIFY_PATH = "/_matrix/push/v1/notify"
MAX_BODY_BYTES = 512 * 1024
OTHER_METHODS = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]

router = APIRouter(tags=["matrix"])
log = logging.getLogger(__name__)


def _error(status: int, errcode: str, message: str, headers: dict[str, str] | None = None) -> Answer:
    return status, {"errcode": errcode, "error": message}, headers


def _error_response(
    status: int, errcode: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    status, document, headers = _error(status, errcode, message, headers)
    return JSONResponse(document, status_code=status, headers=headers)


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["errcode", "error"],
    "properties": {"errcode": {"type": "string"}, "error": {"type": "string"}},
}
_DEVICE_SCHEMA = {
    "type": "object",
    "required": ["app_id", "pushkey"],
    "properties": {
        "app_id": {"type": "string", "maxLength": 64},
        "pushkey": {"type": "string", "description": "at most 512 bytes"},
        "pushkey_ts": {"type": "integer"},
        "data": {"type": "object", "description": "the pusher's data minus url: format, default_payload"},
        "tweaks": {"type": "object"},
    },
}
_NOTIFICATION_SCHEMA = {
    "type": "object",
    "required": ["devices"],
    "properties": {
        "event_id": {"type": "string"},
        "room_id": {"type": "string"},
        "type": {"type": ["string", "null"]},
        "sender": {"type": ["string", "null"]},
        "sender_display_name": {"type": "string"},
        "room_name": {"type": "string"},
        "room_alias": {"type": "string"},
        "membership": {"type": "string"},
        "user_is_target": {"type": "boolean"},
        "prio": {"type": "string", "enum": ["high", "low"], "default": "high"},
        "content": {"type": "object"},
        "counts": {
            "type": "object",
            "properties": {"unread": {"type": "integer"}, "missed_calls": {"type": "integer"}},
        },
        "devices": {"type": "array", "minItems": 1, "items": _DEVICE_SCHEMA},
    },
}


def _json_response(description: str, schema: Mapping[str, object]) -> dict[str, object]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["notification"],
                    "properties": {"notification": _NOTIFICATION_SCHEMA},
                }
            }
        },
    },
    "responses": {
        "200": _json_response(
            "sent; `rejected` lists the pushkeys the homeserver should drop, as it sent them",
            {"type": "object", "properties": {"rejected": {"type": "array", "items": {"type": "string"}}}},
        ),
        "400": _json_response(
            "M_NOT_JSON (the body does not parse) or M_BAD_JSON (its shape)", _ERROR_SCHEMA
        ),
        "404": _json_response("M_UNRECOGNIZED: the gateway is not configured", _ERROR_SCHEMA),
        "408": _json_response("M_UNKNOWN: the body did not arrive within the request timeout", _ERROR_SCHEMA),
        "413": _json_response("M_TOO_LARGE: body over 512 KiB", _ERROR_SCHEMA),
        "502": _json_response(
            "M_UNKNOWN: a device failed for a reason that is not its token's", _ERROR_SCHEMA
        ),
    },
}


class NotifyFastPath:
    """Answers POST /_matrix/push/v1/notify ahead of the whole FastAPI app (it wraps the app as
    served): a homeserver's every notification comes here, and FastAPI's middleware stack, the
    router's matching, dependency solving and request and response objects cost about as much CPU
    as the push itself. The answers are the documented route's (`answer`), which serves the same
    when this is not in front."""

    def __init__(self, app: ASGIApp, gateway: Gateway | None, slots: ReadSlots) -> None:
        self.app, self.gateway, self.slots = app, gateway, slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != NOTIFY_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        status, document, headers = await answer(self.gateway, _chunks(receive), _declared(scope), self.slots)
        body = NOTHING_REJECTED if document == _NOTHING_REJECTED else _json_bytes(document)
        extra = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
        fixed = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": fixed + extra})
        await send({"type": "http.response.body", "body": body})


@router.post(NOTIFY_PATH, summary="Matrix Push Gateway API: notify devices", openapi_extra=_OPENAPI)
async def notify(request: Request) -> JSONResponse:
    # The route as documented; NotifyFastPath answers it ahead of the router.
    status, document, headers = await answer(
        request.app.state.gateway, request.stream(), declared_length(request), request.app.state.read_slots
    )
    return JSONResponse(document, status_code=status, headers=headers)


Answer = tuple[int, dict[str, Any], dict[str, str] | None]
# The answer to nearly every request, written once.
_NOTHING_REJECTED: dict[str, Any] = {"rejected": []}
NOTHING_REJECTED = b'{"rejected":[]}'
_counted_by_status: dict[int, Any] = {}


def _json_bytes(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _count(status: int) -> None:
    counter = _counted_by_status.get(status)
    if counter is None:
        counter = _counted_by_status[status] = matrix_notifications_total.labels(str(status))
    counter.inc()


async def answer(
    gateway: Gateway | None, chunks: AsyncIterator[bytes], declared: int | None, slots: ReadSlots
) -> Answer:
    """A notify request's answer (status, JSON document, extra headers), counted and timed; its body
    past the first window read under one of `slots`."""
    started = time.perf_counter()
    result = await _answer(gateway, chunks, declared, slots)
    _count(result[0])
    matrix_notify_seconds.observe(time.perf_counter() - started)
    return result


async def _answer(
    gateway: Gateway | None, chunks: AsyncIterator[bytes], declared: int | None, slots: ReadSlots
) -> Answer:
    if gateway is None:
        return _error(404, "M_UNRECOGNIZED", "Unrecognized request: no push gateway apps are configured")
    arrived_at = time.monotonic()  # one timeout for the body and the sending
    try:
        with gateway.deadlines.bound(until=arrived_at + gateway.timeout_seconds):
            body = await collect_chunks(chunks, declared, MAX_BODY_BYTES, slots)
        notification = parse_notification(body)
    except BodyTooLarge:
        return _error(413, "M_TOO_LARGE", f"body is larger than {MAX_BODY_BYTES} bytes")
    except TimeoutError:
        return _error(408, "M_UNKNOWN", "body did not arrive in time")
    except BadNotification as error:
        log.info("notify refused: %s", error)  # names the field, never a value
        return _error(400, error.errcode, str(error))
    result = await gateway.notify(notification, arrived_at)
    if result.status != 200:
        return _error(result.status, "M_UNKNOWN", "a device could not be notified; try again later")
    return 200, {"rejected": result.rejected}, None


@router.get(
    "/health",
    summary="Sygnal's liveness probe: 200 with an empty body while the process runs",
    response_class=Response,
    responses={200: {"description": "the process runs", "content": {}}},
)
@router.head("/health", include_in_schema=False)
async def health() -> Response:
    # Sygnal's Docker image's HEALTHCHECK and load balancers set up for Sygnal ask this path.
    return Response(status_code=200)


@router.api_route(NOTIFY_PATH, methods=OTHER_METHODS, include_in_schema=False)
async def wrong_method() -> JSONResponse:
    return _error_response(405, "M_UNRECOGNIZED", "Unrecognized request: use POST", {"Allow": "POST"})


@router.api_route("/_matrix/{path:path}", methods=["POST", *OTHER_METHODS], include_in_schema=False)
async def unknown_path() -> JSONResponse:
    return _error_response(404, "M_UNRECOGNIZED", "Unrecognized request")


# ----------------------------------------------------------------------------- the fast path's input


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def _declared(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return content_length(value)
    return None
