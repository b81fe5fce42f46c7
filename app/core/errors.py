"""Domain errors: a status code name and a constant message.

Transports map the code to a gRPC status or a Connect error. Messages are
fixed strings: they never carry ids, secrets, tokens, URLs, topics or keys.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    PERMISSION_DENIED = "permission_denied"
    FAILED_PRECONDITION = "failed_precondition"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL = "internal"
    UNAUTHENTICATED = "unauthenticated"
    UNIMPLEMENTED = "unimplemented"


@dataclass(frozen=True, slots=True)
class Violation:
    """Which request field broke which rule: constant words beside the constant message (a
    google.rpc.BadRequest field violation on the wire), never the field's value."""

    field: str
    description: str


class DomainError(Exception):
    def __init__(self, code: Code, message: str, violation: Violation | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violation = violation


MALFORMED = "request is malformed"
NOT_REGISTERED = "recipient is not registered"
BAD_SECRET = "recipient secret is not valid"
CHANNEL_NOT_CONFIGURED = "channel is not configured"
URL_NOT_ALLOWED = "webhook url is not allowed"
SIGNING_KEY_LENGTH = "webhook signing key length is not allowed"
SUBSCRIPTION_MALFORMED = "subscription is malformed"
TOPIC_LIMIT = "recipient topic limit reached"
UNAVAILABLE = "service is unavailable"
DEADLINE = "request did not finish in time"
TOO_MANY_REQUESTS = "too many requests; retry later"


class Throttled(DomainError):
    """A call over a caller's quota (docs/callers.md#quotas-per-caller): UNAVAILABLE, which the SDK
    retries with backoff, and over Connect a Retry-After in whole seconds."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(Code.UNAVAILABLE, TOO_MANY_REQUESTS)
        self.retry_after_seconds = retry_after_seconds


def malformed() -> DomainError:
    return DomainError(Code.INVALID_ARGUMENT, MALFORMED)
