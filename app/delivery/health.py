"""A provider's health as gauges: whether its credentials are accepted, and its connections.

Labelled by channel and app (operator-configured names), never by anything a user registered.
"""

from __future__ import annotations

from app.core import metrics


class ProviderHealth:
    """What one provider has learnt of its credentials and connections."""

    def __init__(self, channel: str, app: str) -> None:
        self._ok = metrics.credentials_ok.labels(channel, app)
        self._refused = metrics.credentials_refused_total.labels(channel, app)
        self._connections = metrics.provider_connections.labels(channel, app)
        self._connects = metrics.provider_connects_total.labels(channel, app)
        self._ok.set(1)  # not judged yet: not known bad

    def accepted(self) -> None:
        """An answer that took the credentials (a delivery, or any verdict on the push itself)."""
        self._ok.set(1)

    def refused(self) -> None:
        """An answer that refused the credentials (a bad or revoked key, a wrong team or project)."""
        self._ok.set(0)
        self._refused.inc()

    def connected(self) -> None:
        self._connects.inc()

    def connections(self, count: int) -> None:
        self._connections.set(count)
