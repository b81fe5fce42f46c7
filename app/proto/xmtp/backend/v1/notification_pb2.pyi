from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Channel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_UNSPECIFIED: _ClassVar[Channel]
    CHANNEL_APNS: _ClassVar[Channel]
    CHANNEL_FCM: _ClassVar[Channel]
    CHANNEL_HTTP: _ClassVar[Channel]
CHANNEL_UNSPECIFIED: Channel
CHANNEL_APNS: Channel
CHANNEL_FCM: Channel
CHANNEL_HTTP: Channel

class ApnsDelivery(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class FcmDelivery(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class HttpDelivery(_message.Message):
    __slots__ = ("url", "signing_key")
    URL_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_FIELD_NUMBER: _ClassVar[int]
    url: str
    signing_key: bytes
    def __init__(self, url: _Optional[str] = ..., signing_key: _Optional[bytes] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("recipient_id", "recipient_secret", "apns", "fcm", "http", "metadata")
    RECIPIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    APNS_FIELD_NUMBER: _ClassVar[int]
    FCM_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    recipient_id: bytes
    recipient_secret: bytes
    apns: ApnsDelivery
    fcm: FcmDelivery
    http: HttpDelivery
    metadata: bytes
    def __init__(self, recipient_id: _Optional[bytes] = ..., recipient_secret: _Optional[bytes] = ..., apns: _Optional[_Union[ApnsDelivery, _Mapping]] = ..., fcm: _Optional[_Union[FcmDelivery, _Mapping]] = ..., http: _Optional[_Union[HttpDelivery, _Mapping]] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("recipient_id", "recipient_secret")
    RECIPIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    recipient_id: bytes
    recipient_secret: bytes
    def __init__(self, recipient_id: _Optional[bytes] = ..., recipient_secret: _Optional[bytes] = ...) -> None: ...

class UnregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("topic", "hmac_epoch_base", "hmac_keys", "include_commits")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    HMAC_EPOCH_BASE_FIELD_NUMBER: _ClassVar[int]
    HMAC_KEYS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_COMMITS_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    hmac_epoch_base: int
    hmac_keys: _containers.RepeatedScalarFieldContainer[bytes]
    include_commits: bool
    def __init__(self, topic: _Optional[bytes] = ..., hmac_epoch_base: _Optional[int] = ..., hmac_keys: _Optional[_Iterable[bytes]] = ..., include_commits: _Optional[bool] = ...) -> None: ...

class UpdateSubscriptionsRequest(_message.Message):
    __slots__ = ("recipient_id", "recipient_secret", "adds", "removes")
    RECIPIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    ADDS_FIELD_NUMBER: _ClassVar[int]
    REMOVES_FIELD_NUMBER: _ClassVar[int]
    recipient_id: bytes
    recipient_secret: bytes
    adds: _containers.RepeatedCompositeFieldContainer[Subscription]
    removes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, recipient_id: _Optional[bytes] = ..., recipient_secret: _Optional[bytes] = ..., adds: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., removes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RecipientState(_message.Message):
    __slots__ = ("topic_count", "channel", "expires_at_ns")
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_NS_FIELD_NUMBER: _ClassVar[int]
    topic_count: int
    channel: Channel
    expires_at_ns: int
    def __init__(self, topic_count: _Optional[int] = ..., channel: _Optional[_Union[Channel, str]] = ..., expires_at_ns: _Optional[int] = ...) -> None: ...
