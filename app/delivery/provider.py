"""The interface every delivery channel implements."""

from __future__ import annotations

from typing import Protocol

from app.delivery.types import Outcome, Push

DEFAULT_APP = "default"  # the app of the flat XMTP_PUSH_APNS_* / XMTP_PUSH_FCM_* settings


class Provider(Protocol):
    channel: str  # apns | fcm | http | webpush
    app: str  # whose credentials it sends with

    async def send(self, push: Push) -> Outcome:
        """One attempt, bounded in time; never raises for a delivery failure."""

    def sample_gauges(self) -> None:
        """Set this provider's gauges from its state (connections open, token age); before a scrape."""

    async def close(self) -> None: ...
