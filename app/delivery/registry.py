"""The providers of the configured channels, each with its long-lived client."""

from __future__ import annotations

from app.core.config import Settings
from app.delivery.credentials import apns_credentials, fcm_credentials
from app.delivery.provider import Provider
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookProvider
from app.delivery.url_policy import UrlPolicy


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
