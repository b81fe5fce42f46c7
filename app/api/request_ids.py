"""Every HTTP answer names its request: `x-request-id`, the caller's when it sent a sane one, else
one made here; a W3C `traceparent` the caller sent is taken in. Both ids go on the request's log
lines (`app.core.logging.request_ids`, a context variable every line of the request's task reads).

Pure ASGI, and cheap: it wraps every HTTP server of a process, the Matrix notify fast path's
included, whose whole answer costs a few hundred microseconds of CPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.ids import UuidSequence
from app.core.logging import request_ids

REQUEST_ID = b"x-request-id"
TRACEPARENT = b"traceparent"
# At most 128 visible ASCII characters: nothing that could split a log line or a header.
SANE_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
# version, trace id, parent id, flags; version 00 has these four fields, a later one may add more.
TRACEPARENT_FORMAT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?")
NO_TRACE, NO_PARENT = b"0" * 32, b"0" * 16
FAILED_ANSWER = b"Internal Server Error"
_new_ids = UuidSequence()


def request_id(sent: bytes | None) -> bytes:
    """The caller's request id when it is sane, else a new one."""
    if sent is not None and SANE_REQUEST_ID.fullmatch(sent):
        return sent
    return _new_ids.next().encode()


def trace_id(traceparent: bytes | None) -> bytes | None:
    """The trace id of a valid W3C `traceparent` header, or None."""
    match = TRACEPARENT_FORMAT.fullmatch(traceparent) if traceparent is not None else None
    if match is None:
        return None
    version, trace, parent, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest) or trace == NO_TRACE or parent == NO_PARENT:
        return None
    return trace


def _sent(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    sent_id = traceparent = None
    for name, value in headers:
        if name == REQUEST_ID:
            sent_id = value
        elif name == TRACEPARENT:
            traceparent = value
    return sent_id, traceparent


class RequestIds:
    """The ASGI app `app` with `x-request-id` on its every HTTP answer and both ids on its lines."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent_id, traceparent = _sent(scope["headers"])
        ids = request_id(sent_id), trace_id(traceparent) if traceparent is not None else None
        header = (REQUEST_ID, ids[0])
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        token = request_ids.set(ids)
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if not started:  # the server's own 500 would go without the id
                await _failed(send_with_id)
            raise
        finally:
            request_ids.reset(token)


async def _failed(send: Send) -> None:
    length = str(len(FAILED_ANSWER)).encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", length)]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": FAILED_ANSWER})
