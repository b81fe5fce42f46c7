from app.proto.xmtp.xmtpv4.envelopes import envelopes_pb2 as _envelopes_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeAllEnvelopesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubscribeEnvelopesResponse(_message.Message):
    __slots__ = ("envelopes",)
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    envelopes: _containers.RepeatedCompositeFieldContainer[_envelopes_pb2.OriginatorEnvelope]
    def __init__(self, envelopes: _Optional[_Iterable[_Union[_envelopes_pb2.OriginatorEnvelope, _Mapping]]] = ...) -> None: ...

class EnvelopesQuery(_message.Message):
    __slots__ = ("topics", "originator_node_ids", "last_seen")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ORIGINATOR_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[bytes]
    originator_node_ids: _containers.RepeatedScalarFieldContainer[int]
    last_seen: _envelopes_pb2.Cursor
    def __init__(self, topics: _Optional[_Iterable[bytes]] = ..., originator_node_ids: _Optional[_Iterable[int]] = ..., last_seen: _Optional[_Union[_envelopes_pb2.Cursor, _Mapping]] = ...) -> None: ...

class QueryEnvelopesRequest(_message.Message):
    __slots__ = ("query", "limit")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    query: EnvelopesQuery
    limit: int
    def __init__(self, query: _Optional[_Union[EnvelopesQuery, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class QueryEnvelopesResponse(_message.Message):
    __slots__ = ("envelopes",)
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    envelopes: _containers.RepeatedCompositeFieldContainer[_envelopes_pb2.OriginatorEnvelope]
    def __init__(self, envelopes: _Optional[_Iterable[_Union[_envelopes_pb2.OriginatorEnvelope, _Mapping]]] = ...) -> None: ...
