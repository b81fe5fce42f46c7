"""The interface every delivery channel implements."""

from __future__ import annotations

from typing import Protocol

from app.delivery.types import Hint, Outcome, Target


class Provider(Protocol):
    channel_label: str  # apns | fcm | http

    async def send(self, hint: Hint, target: Target) -> Outcome:
        """One attempt, bounded in time; never raises for a delivery failure."""

    async def close(self) -> None: ...
