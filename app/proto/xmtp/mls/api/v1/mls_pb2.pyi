from app.proto.xmtp.mls.message_contents import welcome_pointer_pb2 as _welcome_pointer_pb2
from app.proto.xmtp.mls.message_contents import wrapper_encryption_pb2 as _wrapper_encryption_pb2
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
        __slots__ = ("installation_key", "data", "hpke_public_key", "wrapper_algorithm", "welcome_metadata")
        INSTALLATION_KEY_FIELD_NUMBER: _ClassVar[int]
        DATA_FIELD_NUMBER: _ClassVar[int]
        HPKE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
        WRAPPER_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
        WELCOME_METADATA_FIELD_NUMBER: _ClassVar[int]
        installation_key: bytes
        data: bytes
        hpke_public_key: bytes
        wrapper_algorithm: _wrapper_encryption_pb2.WelcomeWrapperAlgorithm
        welcome_metadata: bytes
        def __init__(self, installation_key: _Optional[bytes] = ..., data: _Optional[bytes] = ..., hpke_public_key: _Optional[bytes] = ..., wrapper_algorithm: _Optional[_Union[_wrapper_encryption_pb2.WelcomeWrapperAlgorithm, str]] = ..., welcome_metadata: _Optional[bytes] = ...) -> None: ...
    class WelcomePointer(_message.Message):
        __slots__ = ("installation_key", "welcome_pointer", "hpke_public_key", "wrapper_algorithm")
        INSTALLATION_KEY_FIELD_NUMBER: _ClassVar[int]
        WELCOME_POINTER_FIELD_NUMBER: _ClassVar[int]
        HPKE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
        WRAPPER_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
        installation_key: bytes
        welcome_pointer: bytes
        hpke_public_key: bytes
        wrapper_algorithm: _welcome_pointer_pb2.WelcomePointerWrapperAlgorithm
        def __init__(self, installation_key: _Optional[bytes] = ..., welcome_pointer: _Optional[bytes] = ..., hpke_public_key: _Optional[bytes] = ..., wrapper_algorithm: _Optional[_Union[_welcome_pointer_pb2.WelcomePointerWrapperAlgorithm, str]] = ...) -> None: ...
    V1_FIELD_NUMBER: _ClassVar[int]
    WELCOME_POINTER_FIELD_NUMBER: _ClassVar[int]
    v1: WelcomeMessageInput.V1
    welcome_pointer: WelcomeMessageInput.WelcomePointer
    def __init__(self, v1: _Optional[_Union[WelcomeMessageInput.V1, _Mapping]] = ..., welcome_pointer: _Optional[_Union[WelcomeMessageInput.WelcomePointer, _Mapping]] = ...) -> None: ...

class GroupMessage(_message.Message):
    __slots__ = ("v1",)
    class V1(_message.Message):
        __slots__ = ("id", "created_ns", "group_id", "data", "sender_hmac", "should_push", "is_commit")
        ID_FIELD_NUMBER: _ClassVar[int]
        CREATED_NS_FIELD_NUMBER: _ClassVar[int]
        GROUP_ID_FIELD_NUMBER: _ClassVar[int]
        DATA_FIELD_NUMBER: _ClassVar[int]
        SENDER_HMAC_FIELD_NUMBER: _ClassVar[int]
        SHOULD_PUSH_FIELD_NUMBER: _ClassVar[int]
        IS_COMMIT_FIELD_NUMBER: _ClassVar[int]
        id: int
        created_ns: int
        group_id: bytes
        data: bytes
        sender_hmac: bytes
        should_push: bool
        is_commit: bool
        def __init__(self, id: _Optional[int] = ..., created_ns: _Optional[int] = ..., group_id: _Optional[bytes] = ..., data: _Optional[bytes] = ..., sender_hmac: _Optional[bytes] = ..., should_push: _Optional[bool] = ..., is_commit: _Optional[bool] = ...) -> None: ...
    V1_FIELD_NUMBER: _ClassVar[int]
    v1: GroupMessage.V1
    def __init__(self, v1: _Optional[_Union[GroupMessage.V1, _Mapping]] = ...) -> None: ...

class WelcomeMessage(_message.Message):
    __slots__ = ("v1", "welcome_pointer")
    class V1(_message.Message):
        __slots__ = ("id", "created_ns", "installation_key", "data", "hpke_public_key", "wrapper_algorithm", "welcome_metadata")
        ID_FIELD_NUMBER: _ClassVar[int]
        CREATED_NS_FIELD_NUMBER: _ClassVar[int]
        INSTALLATION_KEY_FIELD_NUMBER: _ClassVar[int]
        DATA_FIELD_NUMBER: _ClassVar[int]
        HPKE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
        WRAPPER_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
        WELCOME_METADATA_FIELD_NUMBER: _ClassVar[int]
        id: int
        created_ns: int
        installation_key: bytes
        data: bytes
        hpke_public_key: bytes
        wrapper_algorithm: _wrapper_encryption_pb2.WelcomeWrapperAlgorithm
        welcome_metadata: bytes
        def __init__(self, id: _Optional[int] = ..., created_ns: _Optional[int] = ..., installation_key: _Optional[bytes] = ..., data: _Optional[bytes] = ..., hpke_public_key: _Optional[bytes] = ..., wrapper_algorithm: _Optional[_Union[_wrapper_encryption_pb2.WelcomeWrapperAlgorithm, str]] = ..., welcome_metadata: _Optional[bytes] = ...) -> None: ...
    class WelcomePointer(_message.Message):
        __slots__ = ("id", "created_ns", "installation_key", "welcome_pointer", "hpke_public_key", "wrapper_algorithm")
        ID_FIELD_NUMBER: _ClassVar[int]
        CREATED_NS_FIELD_NUMBER: _ClassVar[int]
        INSTALLATION_KEY_FIELD_NUMBER: _ClassVar[int]
        WELCOME_POINTER_FIELD_NUMBER: _ClassVar[int]
        HPKE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
        WRAPPER_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
        id: int
        created_ns: int
        installation_key: bytes
        welcome_pointer: bytes
        hpke_public_key: bytes
        wrapper_algorithm: _welcome_pointer_pb2.WelcomePointerWrapperAlgorithm
        def __init__(self, id: _Optional[int] = ..., created_ns: _Optional[int] = ..., installation_key: _Optional[bytes] = ..., welcome_pointer: _Optional[bytes] = ..., hpke_public_key: _Optional[bytes] = ..., wrapper_algorithm: _Optional[_Union[_welcome_pointer_pb2.WelcomePointerWrapperAlgorithm, str]] = ...) -> None: ...
    V1_FIELD_NUMBER: _ClassVar[int]
    WELCOME_POINTER_FIELD_NUMBER: _ClassVar[int]
    v1: WelcomeMessage.V1
    welcome_pointer: WelcomeMessage.WelcomePointer
    def __init__(self, v1: _Optional[_Union[WelcomeMessage.V1, _Mapping]] = ..., welcome_pointer: _Optional[_Union[WelcomeMessage.WelcomePointer, _Mapping]] = ...) -> None: ...

class UploadKeyPackageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
