"""A refusal's field violation on the wire, beside the constant message: a google.rpc.BadRequest in
the gRPC status details (`grpc-status-details-bin`, as grpcio-status writes it) and in a Connect
error's `details` (with its JSON form under `debug`, for people reading the answer)."""

from __future__ import annotations

import base64
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from app.core.errors import Violation

DETAILS_KEY = "grpc-status-details-bin"
BAD_REQUEST = "google.rpc.BadRequest"


def bad_request(violation: Violation) -> error_details_pb2.BadRequest:
    field = error_details_pb2.BadRequest.FieldViolation(
        field=violation.field, description=violation.description
    )
    return error_details_pb2.BadRequest(field_violations=[field])


def grpc_trailers(code: grpc.StatusCode, message: str, violation: Violation) -> tuple[tuple[str, bytes]]:
    detail = any_pb2.Any()
    detail.Pack(bad_request(violation))
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return ((DETAILS_KEY, status.SerializeToString()),)


def connect_details(violation: Violation) -> list[dict[str, Any]]:
    value = base64.b64encode(bad_request(violation).SerializeToString()).decode().rstrip("=")
    debug = {"fieldViolations": [{"field": violation.field, "description": violation.description}]}
    return [{"type": BAD_REQUEST, "value": value, "debug": debug}]
