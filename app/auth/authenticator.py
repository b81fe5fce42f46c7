"""Who is calling: the bearer credential of a call checked as docs/callers.md#who-may-call says, each
rejection counted in `xmtp_push_auth_rejections_total{reason}` and told in one DEBUG line with the RPC,
the transport and the reason (never anything of the credential)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.auth.api_keys import ApiKeys
from app.auth.bearer import bearer_token
from app.auth.keys import KeySet
from app.auth.rejections import NOT_TRUSTED, REASONS, Rejected, Rejection
from app.auth.tokens import ClaimPolicy, verify_jwt
from app.core.config import Settings
from app.core.metrics import auth_rejections_total

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call is from: an API key's name, or a JWT's issuer and subject. Never logged but the key's
    name (an operator's label)."""

    api_key: str | None = None
    issuer: str | None = None
    subject: str | None = None

    def identity(self) -> str:
        """Who counts as one caller for the quotas (app.quotas): never logged."""
        if self.api_key is not None:
            return f"api-key:{self.api_key}"
        return f"jwt:{self.issuer or ''}\x00{self.subject or ''}"


class Authenticator:
    def __init__(
        self,
        api_keys: ApiKeys,
        jwt_keys: Callable[[], KeySet] | None,
        policy: ClaimPolicy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api_keys, self.jwt_keys, self.policy, self.clock = api_keys, jwt_keys, policy, clock
        self._counters = {reason: auth_rejections_total.labels(reason) for reason in REASONS}

    @classmethod
    def from_settings(cls, settings: Settings, jwt_keys: Callable[[], KeySet] | None) -> Authenticator:
        policy = ClaimPolicy(
            settings.auth_leeway_seconds,
            settings.auth_audiences,
            settings.auth_issuers,
            settings.auth_required_scopes,
        )
        return cls(ApiKeys(settings.auth_api_keys or ()), jwt_keys, policy)

    def admit(self, values: Sequence[bytes], rpc: str, transport: str) -> Principal | Rejection:
        """`values`: every `authorization` header of the call, in order."""
        try:
            return self._principal(bearer_token(values))
        except Rejected as rejected:
            reason = rejected.rejection.reason
            self._counters[reason].inc()
            log.debug("auth: %s over %s refused (%s)", rpc, transport, reason)
            return rejected.rejection

    def _principal(self, token: bytes) -> Principal:
        if len(self.api_keys):
            name = self.api_keys.match(token)
            if name is not None:
                return Principal(api_key=name)
        if self.jwt_keys is None:
            raise Rejected(NOT_TRUSTED)
        claims = verify_jwt(token, self.jwt_keys(), self.policy, self.clock())
        return Principal(issuer=claims.iss, subject=claims.sub)
