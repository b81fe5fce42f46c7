"""Why a call was refused: the reason (the metric's label), the status code and the constant message
that both transports answer (docs/callers.md#rejections). No rejection carries anything of the call."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import Code, DomainError

MISSING = "missing"
MALFORMED = "malformed"
UNSUPPORTED_ALG = "unsupported_alg"
UNTRUSTED = "untrusted"
EXPIRED = "expired"
NOT_YET_VALID = "not_yet_valid"
AUDIENCE = "audience"
ISSUER = "issuer"
SCOPE = "scope"
REASONS = (MISSING, MALFORMED, UNSUPPORTED_ALG, UNTRUSTED, EXPIRED, NOT_YET_VALID, AUDIENCE, ISSUER, SCOPE)
NOT_A_JWT = "token is not a supported JWT"


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    code: Code
    message: str

    def error(self) -> DomainError:
        return DomainError(self.code, self.message)


class Rejected(Exception):
    """Raised inside the checks; the authenticator turns it into its answer."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.reason)
        self.rejection = rejection


def _unauthenticated(reason: str, message: str) -> Rejection:
    return Rejection(reason, Code.UNAUTHENTICATED, message)


NO_HEADER = _unauthenticated(MISSING, "missing bearer token")
NOT_BEARER = _unauthenticated(MALFORMED, "authorization header is not a bearer token")
BAD_TOKEN = _unauthenticated(MALFORMED, NOT_A_JWT)
BAD_ALG = _unauthenticated(UNSUPPORTED_ALG, NOT_A_JWT)
NOT_TRUSTED = _unauthenticated(UNTRUSTED, "token signature is not trusted")
HAS_EXPIRED = _unauthenticated(EXPIRED, "token has expired")
NOT_YET = _unauthenticated(NOT_YET_VALID, "token is not yet valid")
WRONG_AUDIENCE = _unauthenticated(AUDIENCE, "token audience is not allowed")
WRONG_ISSUER = _unauthenticated(ISSUER, "token issuer is not allowed")
# PERMISSION_DENIED, not UNAUTHENTICATED: a fresh token from the same source has the same scopes, and
# the SDK would otherwise refresh it and count each answer toward its lockout.
MISSING_SCOPE = Rejection(SCOPE, Code.PERMISSION_DENIED, "token is missing a required scope")
