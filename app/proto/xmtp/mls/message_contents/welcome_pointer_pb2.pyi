from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class WelcomePointerWrapperAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WELCOME_POINTER_WRAPPER_ALGORITHM_UNSPECIFIED: _ClassVar[WelcomePointerWrapperAlgorithm]
    WELCOME_POINTER_WRAPPER_ALGORITHM_XWING_MLKEM_768_DRAFT_6: _ClassVar[WelcomePointerWrapperAlgorithm]
WELCOME_POINTER_WRAPPER_ALGORITHM_UNSPECIFIED: WelcomePointerWrapperAlgorithm
WELCOME_POINTER_WRAPPER_ALGORITHM_XWING_MLKEM_768_DRAFT_6: WelcomePointerWrapperAlgorithm
