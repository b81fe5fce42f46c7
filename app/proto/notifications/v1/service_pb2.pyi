from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryMechanism(_message.Message):
    __slots__ = ("apns_device_token", "firebase_device_token", "custom_token")
    APNS_DEVICE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FIREBASE_DEVICE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    apns_device_token: str
    firebase_device_token: str
    custom_token: str
    def __init__(self, apns_device_token: _Optional[str] = ..., firebase_device_token: _Optional[str] = ..., custom_token: _Optional[str] = ...) -> None: ...

class RegisterInstallationRequest(_message.Message):
    __slots__ = ("installation_id", "delivery_mechanism")
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_MECHANISM_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    delivery_mechanism: DeliveryMechanism
    def __init__(self, installation_id: _Optional[str] = ..., delivery_mechanism: _Optional[_Union[DeliveryMechanism, _Mapping]] = ...) -> None: ...

class RegisterInstallationResponse(_message.Message):
    __slots__ = ("installation_id", "valid_until")
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    valid_until: int
    def __init__(self, installation_id: _Optional[str] = ..., valid_until: _Optional[int] = ...) -> None: ...

class DeleteInstallationRequest(_message.Message):
    __slots__ = ("installation_id",)
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    def __init__(self, installation_id: _Optional[str] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("topic", "hmac_keys", "is_silent", "topic_bytes")
    class HmacKey(_message.Message):
        __slots__ = ("thirty_day_periods_since_epoch", "key")
        THIRTY_DAY_PERIODS_SINCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
        KEY_FIELD_NUMBER: _ClassVar[int]
        thirty_day_periods_since_epoch: int
        key: bytes
        def __init__(self, thirty_day_periods_since_epoch: _Optional[int] = ..., key: _Optional[bytes] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    HMAC_KEYS_FIELD_NUMBER: _ClassVar[int]
    IS_SILENT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    hmac_keys: _containers.RepeatedCompositeFieldContainer[Subscription.HmacKey]
    is_silent: bool
    topic_bytes: bytes
    def __init__(self, topic: _Optional[str] = ..., hmac_keys: _Optional[_Iterable[_Union[Subscription.HmacKey, _Mapping]]] = ..., is_silent: _Optional[bool] = ..., topic_bytes: _Optional[bytes] = ...) -> None: ...

class SubscribeWithMetadataRequest(_message.Message):
    __slots__ = ("installation_id", "subscriptions")
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, installation_id: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("installation_id", "topics", "topics_bytes")
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_BYTES_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    topics_bytes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, installation_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., topics_bytes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ("installation_id", "topics", "topics_bytes")
    INSTALLATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_BYTES_FIELD_NUMBER: _ClassVar[int]
    installation_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    topics_bytes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, installation_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., topics_bytes: _Optional[_Iterable[bytes]] = ...) -> None: ...
