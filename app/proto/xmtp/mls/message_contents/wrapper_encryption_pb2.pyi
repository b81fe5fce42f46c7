from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class WelcomeWrapperAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WELCOME_WRAPPER_ALGORITHM_UNSPECIFIED: _ClassVar[WelcomeWrapperAlgorithm]
    WELCOME_WRAPPER_ALGORITHM_CURVE25519: _ClassVar[WelcomeWrapperAlgorithm]
    WELCOME_WRAPPER_ALGORITHM_XWING_MLKEM_768_DRAFT_6: _ClassVar[WelcomeWrapperAlgorithm]
    WELCOME_WRAPPER_ALGORITHM_SYMMETRIC_KEY: _ClassVar[WelcomeWrapperAlgorithm]
WELCOME_WRAPPER_ALGORITHM_UNSPECIFIED: WelcomeWrapperAlgorithm
WELCOME_WRAPPER_ALGORITHM_CURVE25519: WelcomeWrapperAlgorithm
WELCOME_WRAPPER_ALGORITHM_XWING_MLKEM_768_DRAFT_6: WelcomeWrapperAlgorithm
WELCOME_WRAPPER_ALGORITHM_SYMMETRIC_KEY: WelcomeWrapperAlgorithm
