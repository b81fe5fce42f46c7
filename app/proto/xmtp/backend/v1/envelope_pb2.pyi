from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Cursor(_message.Message):
    __slots__ = ("sequence_id",)
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    def __init__(self, sequence_id: _Optional[int] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: bytes
    def __init__(self, topic: _Optional[bytes] = ...) -> None: ...

class MessageHash(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: bytes
    def __init__(self, sha256: _Optional[bytes] = ...) -> None: ...

class EnvelopeMeta(_message.Message):
    __slots__ = ("cursor", "server_ns", "message_hash", "topic", "expiry_ns", "is_commit_or_proposal")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    SERVER_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_HASH_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_NS_FIELD_NUMBER: _ClassVar[int]
    IS_COMMIT_OR_PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    cursor: Cursor
    server_ns: int
    message_hash: MessageHash
    topic: Topic
    expiry_ns: int
    is_commit_or_proposal: bool
    def __init__(self, cursor: _Optional[_Union[Cursor, _Mapping]] = ..., server_ns: _Optional[int] = ..., message_hash: _Optional[_Union[MessageHash, _Mapping]] = ..., topic: _Optional[_Union[Topic, _Mapping]] = ..., expiry_ns: _Optional[int] = ..., is_commit_or_proposal: _Optional[bool] = ...) -> None: ...

class GroupMessage(_message.Message):
    __slots__ = ("data", "sender_hmac", "should_push")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SENDER_HMAC_FIELD_NUMBER: _ClassVar[int]
    SHOULD_PUSH_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sender_hmac: bytes
    should_push: bool
    def __init__(self, data: _Optional[bytes] = ..., sender_hmac: _Optional[bytes] = ..., should_push: _Optional[bool] = ...) -> None: ...

class WelcomeMessage(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeyPackage(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IdentityUpdate(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommitLogEntry(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClientEnvelope(_message.Message):
    __slots__ = ("group_message", "welcome_message", "key_package", "identity_update", "commit_log_entry")
    GROUP_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WELCOME_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_PACKAGE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_UPDATE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_ENTRY_FIELD_NUMBER: _ClassVar[int]
    group_message: GroupMessage
    welcome_message: WelcomeMessage
    key_package: KeyPackage
    identity_update: IdentityUpdate
    commit_log_entry: CommitLogEntry
    def __init__(self, group_message: _Optional[_Union[GroupMessage, _Mapping]] = ..., welcome_message: _Optional[_Union[WelcomeMessage, _Mapping]] = ..., key_package: _Optional[_Union[KeyPackage, _Mapping]] = ..., identity_update: _Optional[_Union[IdentityUpdate, _Mapping]] = ..., commit_log_entry: _Optional[_Union[CommitLogEntry, _Mapping]] = ...) -> None: ...

class ServerEnvelope(_message.Message):
    __slots__ = ("meta", "envelope")
    META_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    meta: EnvelopeMeta
    envelope: ClientEnvelope
    def __init__(self, meta: _Optional[_Union[EnvelopeMeta, _Mapping]] = ..., envelope: _Optional[_Union[ClientEnvelope, _Mapping]] = ...) -> None: ...
