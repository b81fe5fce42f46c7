"""A decrypted device token to one silent push, sent through the delivery core's providers.

Marmot keeps no state: a token is dropped after its one attempt, and the outcome is only counted
(there is no feedback path for a dead token but the metrics).
"""

from __future__ import annotations

from app.delivery.registry import ProviderRegistry
from app.delivery.types import OutcomeKind, Priority, Push, PushKind
from app.marmot.tokens import DeviceToken, Platform

# Silent pushes only: APNs content-available at priority 5 (push type background); FCM data only
# at Android priority high (a normal one may wait for the device's maintenance window).
APNS_BODY = b'{"aps":{"content-available":1}}'
FCM_DATA = {"content_available": "true"}
CHANNELS = {Platform.APNS: "apns", Platform.FCM: "fcm"}

# What each provider outcome counts as in xmtp_push_marmot_tokens_total{outcome}.
TOKEN_OUTCOMES = {
    OutcomeKind.DELIVERED: "delivered",
    OutcomeKind.DEAD: "dead",
    OutcomeKind.MISMATCH: "dead",  # a token of another app is as useless to this one
    OutcomeKind.TRANSIENT: "failed",
    OutcomeKind.REJECTED: "failed",
    OutcomeKind.DEFERRED: "failed",
}


def channel_of(token: DeviceToken) -> str:
    return CHANNELS[token.platform]


def render(token: DeviceToken) -> Push:
    """The push for a token (APNs: its lowercase hex; FCM: its text)."""
    if token.platform is Platform.APNS:
        return Push(token.token, APNS_BODY, PushKind.BACKGROUND, Priority.NORMAL)
    return Push(token.token, FCM_DATA, PushKind.BACKGROUND, Priority.HIGH)


async def dispatch(providers: ProviderRegistry, token: DeviceToken) -> str:
    """Send one token its wake-up; the outcome as the tokens metric names it. A platform with no
    credentials configured counts its tokens as failed."""
    provider = providers.get(channel_of(token))
    if provider is None:
        return "failed"
    outcome = await provider.send(render(token))
    return TOKEN_OUTCOMES[outcome.kind]
