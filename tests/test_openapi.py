"""The committed OpenAPI document is current and documents the Connect routes."""

from __future__ import annotations

import json

import pytest

from app.api.openapi_export import OPENAPI_PATH, render_openapi

CONNECT_PATHS = [
    "/xmtp.backend.v1.NotificationService/Register",
    "/xmtp.backend.v1.NotificationService/Unregister",
    "/xmtp.backend.v1.NotificationService/UpdateSubscriptions",
]
CONNECT_REQUESTS = {
    "Register": "RegisterRequest",
    "Unregister": "UnregisterRequest",
    "UpdateSubscriptions": "UpdateSubscriptionsRequest",
}


def test_committed_document_is_current() -> None:
    assert OPENAPI_PATH.is_file(), f"{OPENAPI_PATH} is missing: run `make openapi`"
    committed = OPENAPI_PATH.read_text(encoding="utf-8")
    assert committed == render_openapi(), (
        "openapi/openapi.json is out of date with the HTTP app: run `make openapi` and commit the result"
    )


def test_rendering_is_deterministic() -> None:
    first = render_openapi()
    assert first == render_openapi()
    assert first.endswith("}\n")
    assert list(json.loads(first)) == sorted(json.loads(first))


@pytest.mark.parametrize("path", CONNECT_PATHS)
def test_connect_routes_document_json_and_proto_bodies(path: str) -> None:
    document = json.loads(render_openapi())
    assert path in document["paths"], f"{path} is not in the OpenAPI document"
    operation = document["paths"][path]["post"]
    content = operation["requestBody"]["content"]
    assert operation["requestBody"]["required"] is True
    assert set(content) >= {"application/json", "application/proto"}
    assert content["application/json"]["schema"]["title"] == CONNECT_REQUESTS[path.rsplit("/", 1)[1]]
    assert content["application/proto"]["schema"] == {"type": "string", "format": "binary"}
    success = operation["responses"]["200"]["content"]
    assert set(success) >= {"application/json", "application/proto"}


def test_register_json_schema_uses_proto3_json_names() -> None:
    document = json.loads(render_openapi())
    body = document["paths"][CONNECT_PATHS[0]]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert {"recipientId", "recipientSecret", "apns", "fcm", "http", "metadata"} <= set(schema["properties"])
    assert schema["properties"]["recipientId"]["format"] == "byte"
