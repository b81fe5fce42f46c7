from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("content_topic", "timestamp_ns", "message")
    CONTENT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    content_topic: str
    timestamp_ns: int
    message: bytes
    def __init__(self, content_topic: _Optional[str] = ..., timestamp_ns: _Optional[int] = ..., message: _Optional[bytes] = ...) -> None: ...

class SubscribeAllRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
