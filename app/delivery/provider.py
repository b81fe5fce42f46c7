"""The interface every delivery channel implements."""

from __future__ import annotations

from typing import Protocol

from app.core.apps import AppName
from app.core.channels import Channel
from app.delivery.types import Outcome, Push


class Provider(Protocol):
    channel: Channel
    app: AppName  # whose credentials it sends with

    async def send(self, push: Push) -> Outcome:
        """One attempt, bounded in time; never raises for a delivery failure."""

    def sample_gauges(self) -> None:
        """Set this provider's gauges from its state (connections open, token age); before a scrape."""

    async def close(self) -> None: ...
