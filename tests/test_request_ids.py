"""Every HTTP answer names its request (docs/api.md#request-ids): `x-request-id`, the caller's when
sane, else a new one; a W3C `traceparent` is taken in; both ids are on the request's log lines, and
the caller's address on none. On the real process (`xmtp-push gateway`), the Matrix notify fast path
included."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.request_ids import RequestIds, request_id, trace_id
from fakes.fake_fcm import FakeFcm
from tests.support.egress import SERVING
from tests.support.matrix import NOTIFY, device, event_id_only, gcm_app, write_config, write_key_files
from tests.support.ops import free_port
from tests.support.process import child, clean_env, events, wait_answering

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _is_new(value: str) -> bool:
    return str(uuid.UUID(value)) == value


@pytest.mark.parametrize("sent", ["abc", "req-1:x/y@z", "a" * 128, "4bf92f3577b34da6a3ce929d0e0e4736", "!~"])
def test_a_sane_request_id_is_kept(sent: str) -> None:
    assert request_id(sent.encode()) == sent.encode()


@pytest.mark.parametrize("sent", [None, "", "a" * 129, "two words", "tab\there", "caf\u00e9", "nul\x00"])
def test_anything_else_gets_a_new_request_id(sent: str | None) -> None:
    made = request_id(None if sent is None else sent.encode("utf-8"))
    assert _is_new(made.decode())
    assert made != request_id(None)


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        (TRACEPARENT, TRACE),
        (f"01-{TRACE}-00f067aa0ba902b7-01-later-fields", TRACE),  # a later version, read as 00
        (f"00-{TRACE}-00f067aa0ba902b7-01-more", None),  # version 00 has four fields
        (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE[:-1]}-00f067aa0ba902b7-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_a_valid_traceparent_gives_its_trace_id(traceparent: str | None, expected: str | None) -> None:
    found = trace_id(None if traceparent is None else traceparent.encode())
    assert (found.decode() if found is not None else None) == expected


async def test_an_app_that_fails_before_answering_is_answered_500_with_the_id() -> None:
    async def failing(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("a bug")

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": "/", "method": "GET", "headers": [(b"x-request-id", b"r-1")]}
    with pytest.raises(RuntimeError):  # still raised, for the server to log
        await RequestIds(failing)(scope, receive, send)
    start: dict[str, Any] = sent[0]
    assert start["status"] == 500 and (b"x-request-id", b"r-1") in start["headers"]
    assert sent[1] == {"type": "http.response.body", "body": b"Internal Server Error"}


@pytest.mark.slow
async def test_every_answer_carries_its_request_id_and_the_lines_carry_both_ids(
    fcm_server: FakeFcm, tmp_path: Path
) -> None:
    _, account = write_key_files(tmp_path, fcm_server)
    config = write_config(tmp_path, {"org.fcm": gcm_app(fcm_server, account)})
    port = free_port()
    env = clean_env(XMTP_PUSH_MATRIX_APPS=config, XMTP_PUSH_HTTP_PORT=str(port), XMTP_PUSH_LOG_LEVEL="DEBUG")
    async with child("gateway", ["gateway"], env) as process:
        await process.line(SERVING)
        await wait_answering(f"http://127.0.0.1:{port}/healthz")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            # The fast path: a device of an app nobody serves (one INFO line), and a body it refuses.
            caller = {"x-request-id": "homeserver-req-17", "traceparent": TRACEPARENT}
            stray = event_id_only(device("org.nobody", "stray.request-ids"))
            answer = await http.post(NOTIFY, json={"notification": stray}, headers=caller)
            assert answer.status_code == 200 and answer.json() == {"rejected": ["stray.request-ids"]}
            assert answer.headers.get_list("x-request-id") == ["homeserver-req-17"]
            refused = await http.post(NOTIFY, content=b"{", headers={"x-request-id": "bad-body-1"})
            assert refused.status_code == 400 and refused.headers["x-request-id"] == "bad-body-1"
            # FastAPI's routes, answered or not found; ids that are not sane are replaced.
            made = []
            for path, headers in (
                ("/healthz", {}),
                ("/readyz", {"x-request-id": "x" * 129}),
                ("/nowhere", {"x-request-id": "two words"}),
            ):
                reply = await http.get(path, headers=headers)
                assert reply.status_code in (200, 404), (path, reply.status_code)
                assert _is_new(reply.headers["x-request-id"]), (path, reply.headers)
                made.append(reply.headers["x-request-id"])
            assert len(set(made)) == 3
        assert await process.stop() == 0

    lines = events(process)
    rejected = [e for e in lines if str(e["event"]).startswith("matrix device rejected")]
    assert [(e["request_id"], e.get("trace_id")) for e in rejected] == [("homeserver-req-17", TRACE)]
    refusals = [e for e in lines if str(e["event"]).startswith("notify refused")]
    assert [(e["request_id"], "trace_id" in e) for e in refusals] == [("bad-body-1", False)]
    # Lines outside a request carry no request's ids; no line names the caller's address.
    assert all("request_id" not in e for e in lines if str(e["event"]).startswith("serving"))
    for event in lines:
        if "request_id" in event:
            assert "127.0.0.1" not in json.dumps(event), event
