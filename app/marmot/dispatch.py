"""A decrypted device token to one push, sent through the delivery core's providers: silent by default,
an alert on APNs when XMTP_PUSH_MARMOT_APNS_MODE says so.

Marmot keeps no state: a token is dropped after its one attempt, and the outcome is only counted
(there is no feedback path for a dead token but the metrics).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from app.core.channels import Channel
from app.core.config import Settings
from app.delivery.registry import ProviderRegistry
from app.delivery.types import OutcomeKind, Priority, Push, PushKind
from app.marmot.push_health import PushHealth
from app.marmot.tokens import DeviceToken, Platform

# Silent pushes only: APNs content-available at priority 5 (push type background); FCM data only
# at Android priority high (a normal one may wait for the device's maintenance window).
APNS_BODY = b'{"aps":{"content-available":1}}'
FCM_DATA = {"content_available": "true"}
CHANNELS = {Platform.APNS: Channel.APNS, Platform.FCM: Channel.FCM}
# The channels Marmot pushes through: those its device tokens name.
MARMOT_CHANNELS = tuple(CHANNELS.values())

# What each provider outcome counts as in xmtp_push_marmot_tokens_total{outcome}.
TOKEN_OUTCOMES = {
    OutcomeKind.DELIVERED: "delivered",
    OutcomeKind.DEAD: "dead",
    OutcomeKind.MISMATCH: "dead",  # a token of another app is as useless to this one
    OutcomeKind.FAILED: "failed",
    OutcomeKind.REJECTED: "failed",
    OutcomeKind.DEFERRED: "failed",
}


def channel_of(token: DeviceToken) -> Channel:
    return CHANNELS[token.platform]


@dataclass(frozen=True, slots=True)
class ApnsPayload:
    """What every Marmot APNs push carries: one body for all (nothing of a trigger is in it)."""

    body: bytes
    kind: PushKind
    priority: Priority
    collapse_id: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ApnsPayload:
        """XMTP_PUSH_MARMOT_APNS_MODE's payload: silent, or an alert (priority 10, push type alert)
        with the configured title and body, mutable-content 1 for `mutable_alert`."""
        collapse_id = settings.marmot_apns_collapse_id
        if settings.marmot_apns_mode == "silent":
            return cls(APNS_BODY, PushKind.BACKGROUND, Priority.NORMAL, collapse_id)
        alert = {"title": settings.marmot_alert_title}
        if settings.marmot_alert_body:
            alert["body"] = settings.marmot_alert_body
        aps: dict[str, object] = {"alert": alert}
        if settings.marmot_apns_mode == "mutable_alert":
            aps["mutable-content"] = 1
        body = json.dumps({"aps": aps}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return cls(body, PushKind.ALERT, Priority.HIGH, collapse_id)


SILENT = ApnsPayload(APNS_BODY, PushKind.BACKGROUND, Priority.NORMAL)


def render(token: DeviceToken, apns: ApnsPayload = SILENT) -> Push:
    """The push for a token (APNs: its lowercase hex; FCM: its text)."""
    if token.platform is Platform.APNS:
        return Push(token.token, apns.body, apns.kind, apns.priority, apns.collapse_id)
    return Push(token.token, FCM_DATA, PushKind.BACKGROUND, Priority.HIGH)


class Dispatcher:
    """Sends tokens their wake-ups through the registry's providers, at most `in_flight` at once per
    channel: a provider's client is slower per push with hundreds waiting on its connections than
    with a few dozen sending (firebase-admin's HTTP pool most of all)."""

    def __init__(
        self,
        providers: ProviderRegistry,
        in_flight: int,
        apns: ApnsPayload = SILENT,
        health: PushHealth | None = None,
    ) -> None:
        self._providers, self._apns = providers, apns
        self._health = PushHealth() if health is None else health
        self._slots = {channel: asyncio.Semaphore(in_flight) for channel in CHANNELS.values()}

    async def send(self, token: DeviceToken) -> str:
        """One attempt; the outcome as the tokens metric names it. A platform with no credentials
        configured counts its tokens as failed."""
        channel = channel_of(token)
        provider = self._providers.get(channel)
        if provider is None:
            return "failed"
        async with self._slots[channel]:
            outcome = await provider.send(render(token, self._apns))
        self._health.note(channel, outcome)
        return TOKEN_OUTCOMES[outcome.kind]
