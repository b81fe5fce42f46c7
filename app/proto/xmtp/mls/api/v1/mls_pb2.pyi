from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupMessageInput(_message.Message):
    __slots__ = ("v1",)
    class V1(_message.Message):
        __slots__ = ("data", "sender_hmac", "should_push")
        DATA_FIELD_NUMBER: _ClassVar[int]
        SENDER_HMAC_FIELD_NUMBER: _ClassVar[int]
        SHOULD_PUSH_FIELD_NUMBER: _ClassVar[int]
        data: bytes
        sender_hmac: bytes
        should_push: bool
        def __init__(self, data: _Optional[bytes] = ..., sender_hmac: _Optional[bytes] = ..., should_push: _Optional[bool] = ...) -> None: ...
    V1_FIELD_NUMBER: _ClassVar[int]
    v1: GroupMessageInput.V1
    def __init__(self, v1: _Optional[_Union[GroupMessageInput.V1, _Mapping]] = ...) -> None: ...

class WelcomeMessageInput(_message.Message):
    __slots__ = ("v1", "welcome_pointer")
    class V1(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class WelcomePointer(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    V1_FIELD_NUMBER: _ClassVar[int]
    WELCOME_POINTER_FIELD_NUMBER: _ClassVar[int]
    v1: WelcomeMessageInput.V1
    welcome_pointer: WelcomeMessageInput.WelcomePointer
    def __init__(self, v1: _Optional[_Union[WelcomeMessageInput.V1, _Mapping]] = ..., welcome_pointer: _Optional[_Union[WelcomeMessageInput.WelcomePointer, _Mapping]] = ...) -> None: ...

class UploadKeyPackageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
