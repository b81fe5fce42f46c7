"""POST /v1/envelopes: envelopes in, queued for fan-out before the 202 is sent."""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.bodies import BodyTooLarge, BodyTooSlow, read_body
from app.envelopes.eligibility import KIND_OTHER, WITHOUT_SHOULD_PUSH
from app.envelopes.parsing import MAX_BATCH, EnvelopeError, parse_json_batch, parse_server_envelope
from app.envelopes.types import Envelope
from app.fanout.service import Ingested, ingest_envelopes
from app.legacy.fanout import enqueue_legacy, from_network
from app.ops.failures import tell_or_log

PROTOBUF = "application/x-protobuf"

router = APIRouter(tags=["ingest"])
log = logging.getLogger(__name__)

_ENVELOPE_SCHEMA = {
    "type": "object",
    "required": ["topic", "sequence_id", "server_ns", "kind"],
    "properties": {
        "topic": {"type": "string", "format": "byte", "description": "kind byte + identifier, base64"},
        "sequence_id": {"type": "string", "pattern": "^[0-9]{1,20}$", "description": "uint64, decimal"},
        "server_ns": {"type": "integer", "minimum": 0, "description": "server timestamp, ns since epoch"},
        "kind": {"type": "string", "enum": ["group_message", "welcome", "other"]},
        "should_push": {"type": "boolean", "default": False},
        "is_commit_or_proposal": {"type": "boolean", "default": False},
        "sender_hmac": {"type": "string", "format": "byte"},
        "data": {"type": "string", "format": "byte"},
        "message": {
            "type": "string",
            "format": "byte",
            "description": (
                "the envelope as a serialized v3 message (`xmtp.mls.api.v1.GroupMessage` or `WelcomeMessage`), "
                "sent as it is to the legacy API's subscriptions; without it, that message is built from "
                "the fields above (docs/legacy.md#the-v3-message)"
            ),
        },
    },
}
_ANSWER_SCHEMA = {
    "type": "object",
    "required": ["accepted", "not_pushable", "not_pushable_reasons"],
    "properties": {
        "accepted": {"type": "integer", "description": "envelopes queued for fan-out"},
        "not_pushable": {"type": "integer", "description": "of those, how many no subscription receives"},
        "not_pushable_reasons": {
            "type": "object",
            "description": (
                f"count by reason: `{WITHOUT_SHOULD_PUSH}` (a group message that is not a commit or "
                f"proposal, without `should_push`), `{KIND_OTHER}` (kind `other` is never pushed)"
            ),
            "additionalProperties": {"type": "integer"},
        },
    },
}
_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["envelopes"],
                    "properties": {
                        "envelopes": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": MAX_BATCH,
                            "items": _ENVELOPE_SCHEMA,
                        }
                    },
                }
            },
            PROTOBUF: {"schema": {"type": "string", "format": "binary", "description": "one ServerEnvelope"}},
        },
    },
    "responses": {
        "202": {
            "description": "queued for fan-out; `not_pushable` of them reach no subscriber, by reason",
            "content": {"application/json": {"schema": _ANSWER_SCHEMA}},
        },
        "400": {"description": "an envelope is malformed; the error names the field; nothing was queued"},
        "401": {"description": "missing or wrong bearer token"},
        "404": {"description": "ingest is disabled (no XMTP_PUSH_INGEST_TOKEN)"},
        "408": {"description": "the body did not arrive within the request timeout"},
        "413": {"description": "body over XMTP_PUSH_INGEST_MAX_BODY_BYTES (4 MiB by default)"},
        "415": {"description": "unsupported content type"},
        "503": {"description": "the queue is unavailable; nothing was queued"},
    },
}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _authorized(request: Request, token: str) -> bool:
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


@router.post("/v1/envelopes", status_code=202, summary="Ingest envelopes for fan-out", openapi_extra=_OPENAPI)
async def ingest(request: Request) -> JSONResponse:
    runtime = request.app.state.runtime
    token = runtime.settings.ingest_token
    if not token:
        return _error(404, "ingest is disabled: set XMTP_PUSH_INGEST_TOKEN to enable it")
    if not _authorized(request, token):
        log.warning("ingest refused: bearer token is missing or not valid")
        return _error(401, "bearer token is missing or not valid")
    settings = runtime.settings
    try:
        body = await read_body(request, settings.ingest_max_body_bytes, settings.request_timeout_seconds)
    except BodyTooLarge:
        log.info("ingest refused: body over %d bytes", settings.ingest_max_body_bytes)
        return _error(413, f"body is larger than {settings.ingest_max_body_bytes} bytes")
    except BodyTooSlow:
        log.info("ingest refused: the body did not arrive in time")
        return _error(408, "body did not arrive in time")
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    try:
        envelopes = _parse(body, content_type)
    except EnvelopeError as error:
        # The message names the field and the rule, never the value.
        log.info("ingest refused: %s", error)
        return _error(400, str(error))
    except _UnsupportedType:
        log.info("ingest refused: unsupported content type")
        return _error(415, "content type must be application/json or application/x-protobuf")
    if runtime.queue is None:
        log.error("ingest refused: no queue is configured")
        return _error(503, "no queue is configured")
    try:
        ingested = await ingest_envelopes(runtime.queue, envelopes)
        if runtime.settings.legacy_api_enabled:
            # Legacy subscriptions of the same topics get them too (a retried call's repeats are dropped
            # by the fan-outs' claims).
            await enqueue_legacy(runtime.queue, from_network(envelopes))
    except Exception as error:
        tell_or_log(error, runtime.dependencies, "ingest answers 503 until it serves", log, "ingest failed")
        return _error(503, "queue is unavailable")
    runtime.dependencies.up("redis")
    return _answer(ingested)


def _answer(ingested: Ingested) -> JSONResponse:
    not_pushable = sum(ingested.not_pushable.values())
    if not_pushable:  # accepted, yet nobody will be woken: say so where an operator looks
        reasons = ", ".join(f"{reason} {count}" for reason, count in ingested.not_pushable.items())
        log.info("ingested %d envelopes, %d not pushable (%s)", ingested.accepted, not_pushable, reasons)
    else:
        log.debug("ingested %d envelopes", ingested.accepted)
    document = {
        "accepted": ingested.accepted,
        "not_pushable": not_pushable,
        "not_pushable_reasons": ingested.not_pushable,
    }
    return JSONResponse(document, status_code=202)


class _UnsupportedType(Exception):
    pass


def _parse(body: bytes, content_type: str) -> list[Envelope]:
    if content_type == PROTOBUF:
        return [parse_server_envelope(body)]
    if content_type != "application/json":
        raise _UnsupportedType
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise EnvelopeError("body: is not valid JSON") from None
    except RecursionError:  # the parser's nesting bound (the interpreter's recursion limit)
        raise EnvelopeError("body: JSON is nested too deeply") from None
    return parse_json_batch(document)
