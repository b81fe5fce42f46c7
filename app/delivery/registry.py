"""The providers of the configured channels, each with its long-lived client."""

from __future__ import annotations

import logging

from app.core.config import Settings
from app.delivery.credentials import apns_credentials, fcm_credentials
from app.delivery.provider import Provider
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookProvider
from app.delivery.types import Outcome, OutcomeKind
from app.delivery.url_policy import UrlPolicy

log = logging.getLogger("app.delivery")
# How loudly an attempt's outcome is logged: a gone token is routine, a failure is not.
OUTCOME_LEVELS = {
    OutcomeKind.DELIVERED: logging.DEBUG,
    OutcomeKind.DEAD: logging.INFO,
    OutcomeKind.MISMATCH: logging.INFO,
    OutcomeKind.TRANSIENT: logging.WARNING,
    OutcomeKind.REJECTED: logging.WARNING,
}


def log_outcome(channel_label: str, outcome: Outcome, seconds: float) -> None:
    """Log one attempt by channel, outcome and duration: never the hint, the target or the reply."""
    level = OUTCOME_LEVELS[outcome.kind]
    if not log.isEnabledFor(level):
        return
    retry = f", retry after {outcome.delay_seconds:.0f} s" if outcome.delay_seconds else ""
    pause = " (channel paused)" if outcome.pause_channel else ""
    log.log(
        level,
        "%s attempt %s in %.0f ms%s%s",
        channel_label,
        outcome.kind.value,
        seconds * 1000,
        retry,
        pause,
        extra={"channel": channel_label, "outcome": outcome.kind.value},
    )


def build_providers(settings: Settings) -> list[Provider]:
    """One provider per configured channel. Call inside the running event loop."""
    providers: list[Provider] = []
    timeout = settings.http_timeout_seconds
    apns = apns_credentials(settings)
    if apns is not None:
        providers.append(ApnsProvider(apns, timeout))
    fcm = fcm_credentials(settings)
    if fcm is not None:
        providers.append(FcmProvider(fcm, timeout))
    if settings.http_enabled:
        providers.append(WebhookProvider(UrlPolicy.from_settings(settings), timeout))
    return providers
