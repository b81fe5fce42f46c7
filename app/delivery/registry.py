"""The providers of every configured (channel, app), built once at start-up and held by the process.

A channel is one provider module and one line in CHANNELS; an app is one set of credentials for
it. The flat XMTP_PUSH_APNS_* / XMTP_PUSH_FCM_* / XMTP_PUSH_HTTP_* settings are the default app;
a source with apps of its own (a Matrix gateway's config file) adds its `ChannelApp`s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, NamedTuple, TypeVar

from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.core.config import Settings
from app.delivery.credentials import ApnsCredentials, FcmCredentials, apns_credentials, fcm_credentials
from app.delivery.egress import DIRECT, EgressProxy
from app.delivery.provider import Provider
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookConfig, WebhookProvider
from app.delivery.providers.webpush import WebPushConfig, WebPushProvider
from app.delivery.types import Outcome, OutcomeKind
from app.delivery.url_policy import UrlPolicy

log = logging.getLogger("app.delivery")

# One app's credentials, as its channel's provider takes them.
ChannelCredentials = ApnsCredentials | FcmCredentials | WebhookConfig | WebPushConfig

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class ChannelLine(Generic[C]):
    """A channel's line: the credentials its provider takes, and how the provider is built from one
    app's credentials and the request bound. The type checker holds the two together in each line;
    `ProviderRegistry.build` refuses an app whose credentials are another channel's."""

    credentials: type[C]
    provider: Callable[Concatenate[C, float, ...], Provider]


def line(credentials: type[C], provider: Callable[Concatenate[C, float, ...], Provider]) -> ChannelLine[Any]:
    """A channel's line, its two parts checked against each other (as a function, so that the
    table's own type does not stand in for the credentials')."""
    return ChannelLine(credentials, provider)


CHANNELS: dict[Channel, ChannelLine[Any]] = {
    Channel.APNS: line(ApnsCredentials, ApnsProvider),
    Channel.FCM: line(FcmCredentials, FcmProvider),
    Channel.HTTP: line(WebhookConfig, WebhookProvider.from_config),
    Channel.WEBPUSH: line(WebPushConfig, WebPushProvider),
}

# How loudly an attempt's outcome is logged: a gone token is routine, a failure is not.
OUTCOME_LEVELS = {
    OutcomeKind.DELIVERED: logging.DEBUG,
    OutcomeKind.DEAD: logging.INFO,
    OutcomeKind.MISMATCH: logging.INFO,
    OutcomeKind.FAILED: logging.WARNING,
    OutcomeKind.REJECTED: logging.WARNING,
    OutcomeKind.DEFERRED: logging.DEBUG,
}


class ChannelApp(NamedTuple):
    """One app of one channel: its credentials as the channel's provider takes them."""

    channel: Channel
    app: AppName
    credentials: ChannelCredentials


class ProviderRegistry:
    """Providers by (channel, app). Built inside the running event loop; closed with the process."""

    def __init__(self, providers: Iterable[Provider] = ()) -> None:
        self._providers = {(provider.channel, provider.app): provider for provider in providers}

    @classmethod
    def build(
        cls, apps: Iterable[ChannelApp], timeout_seconds: float, proxy: EgressProxy = DIRECT
    ) -> ProviderRegistry:
        """`proxy`: what carries the providers' connections (webhooks follow their config's own)."""
        apps = [_checked(a) for a in apps]  # all of them before any provider opens a connection
        return cls(
            CHANNELS[a.channel].provider(a.credentials, timeout_seconds, app=a.app, proxy=proxy) for a in apps
        )

    def get(self, channel: Channel, app: AppName = DEFAULT_APP) -> Provider | None:
        return self._providers.get((channel, app))

    def __iter__(self) -> Iterator[Provider]:
        return iter(self._providers.values())

    def __len__(self) -> int:
        return len(self._providers)

    def sample_gauges(self) -> None:
        for provider in self._providers.values():
            provider.sample_gauges()

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()


def _checked(app: ChannelApp) -> ChannelApp:
    """`app`, whose credentials are its channel's; raises TypeError otherwise."""
    expected = CHANNELS[app.channel].credentials
    if not isinstance(app.credentials, expected):
        raise TypeError(
            f"the {app.channel} channel takes {expected.__name__}, not {type(app.credentials).__name__}"
        )
    return app


def default_apps(settings: Settings) -> list[ChannelApp]:
    """The default app of each channel the flat settings configure; raises SettingsError when a
    configured credential is unusable."""
    apps = []
    apns = apns_credentials(settings)
    if apns is not None:
        apps.append(ChannelApp(Channel.APNS, DEFAULT_APP, apns))
    fcm = fcm_credentials(settings)
    if fcm is not None:
        apps.append(ChannelApp(Channel.FCM, DEFAULT_APP, fcm))
    if settings.http_enabled:
        proxy = EgressProxy.for_webhooks(settings)
        config = WebhookConfig(UrlPolicy.from_settings(settings), settings.http_max_per_host, proxy)
        apps.append(ChannelApp(Channel.HTTP, DEFAULT_APP, config))
    return apps


def log_outcome(channel: Channel, outcome: Outcome, seconds: float) -> None:
    """Log one attempt by channel, outcome and duration: never the push, its address or the reply."""
    level = OUTCOME_LEVELS[outcome.kind]
    if not log.isEnabledFor(level):
        return
    retry = f", retry after {outcome.delay_seconds:.0f} s" if outcome.delay_seconds else ""
    pause = " (channel paused)" if outcome.pause_channel else ""
    log.log(
        level,
        "%s attempt %s in %.0f ms%s%s",
        channel,
        outcome.kind.value,
        seconds * 1000,
        retry,
        pause,
        extra={"channel": channel, "outcome": outcome.kind.value},
    )
