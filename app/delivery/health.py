"""A provider's health as gauges: whether its credentials are accepted, and its connections.

Labelled by channel and app (operator-configured names), never by anything a user registered.
"""

from __future__ import annotations

from app.core import metrics
from app.core.apps import AppName
from app.core.channels import Channel


class ProviderHealth:
    """What one provider has learnt of its credentials and connections. A channel that sends with no
    credentials of its own (webhooks) has no credential gauges, and one whose client does not tell
    the connections it opens (FCM's) no count of them: no number stands for what is not known."""

    def __init__(
        self, channel: Channel, app: AppName, *, credentials: bool = True, connects: bool = True
    ) -> None:
        self._channel, self._app = channel, app.label
        self._connections = metrics.provider_connections.labels(channel, self._app)
        if connects:
            self._connects = metrics.provider_connects_total.labels(channel, self._app)
        if credentials:
            self._ok = metrics.credentials_ok.labels(channel, self._app)
            self._refused = metrics.credentials_refused_total.labels(channel, self._app)
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

    def connections(self, count: int, in_use: int | None = None) -> None:
        """Connections open, and of them those carrying a request when the client tells it."""
        self._connections.set(count)
        if in_use is not None:
            metrics.provider_connections_in_use.labels(self._channel, self._app).set(in_use)
