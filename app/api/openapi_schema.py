"""JSON schemas of protobuf messages under the proto3 JSON mapping, for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_SFIXED32,
}


def message_schema(descriptor: Descriptor) -> dict[str, Any]:
    properties = {field.json_name: _field_schema(field) for field in descriptor.fields}
    return {"title": descriptor.name, "type": "object", "properties": properties}


def _field_schema(field: FieldDescriptor) -> dict[str, Any]:
    schema = _scalar_schema(field)
    if field.is_repeated:
        return {"type": "array", "items": schema}
    return schema


def _scalar_schema(field: FieldDescriptor) -> dict[str, Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        return message_schema(field.message_type)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return {"type": "string", "enum": [value.name for value in field.enum_type.values]}
    if kind == FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "format": "byte", "description": "standard or URL-safe base64"}
    if kind in _INT64:
        return {"type": ["string", "integer"], "description": "64-bit integer; written as a decimal string"}
    if kind in _INT32:
        return {"type": "integer"}
    if kind == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return {"type": "number"}
    return {"type": "string"}
