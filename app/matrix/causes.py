"""Why an app's pushes fail, said once per change: a WARNING naming the cause when an app's pushes
start failing or fail for another reason, one line when they go through again, and each further
failure of the same cause only at DEBUG.

The cause is the provider's outcome's reason (DNS, connection refused, TLS, a timeout, the provider's
status and code, credentials refused) or the gateway's own (no answer within the request's time,
the in-flight limit): never a pushkey, a URL or anything the homeserver sent.
"""

from __future__ import annotations

import logging

from app.core.config import ENV_PREFIX
from app.delivery.types import Outcome

NO_ANSWER = f"no answer within the request's time ({ENV_PREFIX}MATRIX_REQUEST_TIMEOUT_SECONDS)"
NO_PROVIDER = "the app has no provider"

log = logging.getLogger(__name__)


def cause_of(outcome: Outcome) -> str:
    """An outcome's cause as the provider told it, else what its kind says."""
    if outcome.reason:
        return outcome.reason
    return (
        "credentials refused"
        if outcome.credentials_refused
        else f"the provider answered {outcome.kind.value}"
    )


class FailureCauses:
    """The cause each app's pushes last failed with, while they fail."""

    def __init__(self) -> None:
        self._failing: dict[str, str] = {}

    def failed(self, app_id: str, cause: str) -> None:
        if self._failing.get(app_id) == cause:
            log.debug("matrix app %s: a push failed: %s", app_id, cause)
            return
        self._failing[app_id] = cause
        log.warning("matrix app %s: pushes fail: %s", app_id, cause)

    def delivered(self, app_id: str) -> None:
        if app_id in self._failing:
            del self._failing[app_id]
            log.info("matrix app %s: pushes go through again", app_id)
