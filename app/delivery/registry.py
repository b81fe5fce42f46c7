"""The delivery channels, one descriptor each, and the providers of every configured (channel, app),
built once at start-up and held by the process.

A channel is one provider module and one line in CHANNELS: its descriptor, from which the registry,
`config check`, /status, the workers and the recipients' rules read
what they need of it (its credentials type joins `ChannelCredentials` too). An app is
one set of credentials for it. The flat XMTP_PUSH_APNS_* / XMTP_PUSH_FCM_* / XMTP_PUSH_WEBHOOK_*
settings are the default app; a source with apps of its own (a Matrix gateway's config file) adds
its `ChannelApp`s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, NamedTuple, TypeVar

from app.core.apps import DEFAULT_APP, AppName
from app.core.channels import Channel
from app.core.config import (
    APNS_REQUIRED,
    ENV_PREFIX,
    FCM_REQUIRED,
    WEBHOOK_REQUIRED,
    Settings,
    SettingsError,
)
from app.delivery.credentials import ApnsCredentials, FcmCredentials, apns_credentials, fcm_credentials
from app.delivery.egress import DIRECT, EgressProxy
from app.delivery.provider import Provider
from app.delivery.providers.apns import MAX_BODY_BYTES as APNS_MAX_BODY_BYTES
from app.delivery.providers.apns import ApnsProvider
from app.delivery.providers.fcm import RETRY_FLOOR_SECONDS as FCM_RETRY_FLOOR_SECONDS
from app.delivery.providers.fcm import FcmProvider
from app.delivery.providers.webhook import WebhookConfig, WebhookProvider
from app.delivery.providers.webpush import WebPushConfig, WebPushProvider
from app.delivery.retry import RetryPolicy
from app.delivery.types import Outcome, OutcomeKind, Push, payload_size
from app.delivery.url_policy import UrlPolicy

log = logging.getLogger("app.delivery")

# One app's credentials, as its channel's provider takes them.
ChannelCredentials = ApnsCredentials | FcmCredentials | WebhookConfig | WebPushConfig

C = TypeVar("C")


def webhook_config(settings: Settings) -> WebhookConfig | None:
    """The default app's webhook configuration, from the flat XMTP_PUSH_WEBHOOK_* settings."""
    if not settings.all_set(WEBHOOK_REQUIRED):
        return None
    proxy = EgressProxy.for_webhooks(settings)
    return WebhookConfig(
        UrlPolicy.from_settings(settings),
        settings.webhook_max_per_host,
        proxy,
        max_per_fast_host=settings.webhook_max_per_fast_host,
    )


@dataclass(frozen=True, slots=True)
class DefaultApp(Generic[C]):
    """How the flat settings configure a channel's default app."""

    settings: tuple[str, ...]  # every flat setting of the channel (Settings' field names)
    required: tuple[str, ...]  # those that, all set, configure it
    # Its credentials, or None when the settings do not configure it; SettingsError when unusable.
    load: Callable[[Settings], C | None]

    def configured(self, settings: Settings) -> bool:
        """Its settings are present (unusable credentials are refused when loaded, at start-up)."""
        return settings.all_set(self.required)

    def missing(self, settings: Settings) -> tuple[str, ...]:
        """The required settings left unset while others are set (the channel half set); ()
        when all or none are."""
        unset = tuple(name for name in self.required if not settings.all_set((name,)))
        return unset if len(unset) < len(self.required) else ()

    def refuse_half_set(self, settings: Settings) -> None:
        """SettingsError naming the settings missing when the channel is half set."""
        if missing := self.missing(settings):
            given = [name for name in self.required if name not in missing]
            verb = "is" if len(given) == 1 else "are"
            raise SettingsError(
                f"{_env_names(missing)}: not set, while {_env_names(given)} {verb}: set all of "
                f"{_env_names(self.required)}, or none"
            )

    @property
    def configured_by(self) -> str:
        """What the operator sets to configure it, for messages: "XMTP_PUSH_WEBHOOK_ENABLED=true"."""
        names = [f"{ENV_PREFIX}{name.upper()}{_value_to_set(name)}" for name in self.required]
        return " and ".join(filter(None, (", ".join(names[:-1]), names[-1])))


def _env_names(names: Iterable[str]) -> str:
    return ", ".join(f"{ENV_PREFIX}{name.upper()}" for name in names)


def _value_to_set(name: str) -> str:
    return "=true" if Settings.model_fields[name].annotation is bool else ""


@dataclass(frozen=True, slots=True)
class ChannelDescriptor(Generic[C]):
    """All the product knows of one delivery channel beyond its provider module (which sends) and
    the sources (which render its pushes). The type checker holds `credentials`, `provider` and
    `default_app` together in each line; `ProviderRegistry.build` refuses an app whose credentials
    are another channel's."""

    label: str  # its name in operators' words: "APNs", "webhooks"
    credentials: type[C]
    # The provider, built from one app's credentials and the request bound.
    provider: Callable[Concatenate[C, float, ...], Provider]
    # None: no flat settings; only a source's own apps use it (Web Push: the Matrix gateway's).
    default_app: DefaultApp[C] | None
    color: str  # its series on /status
    # How its transient failures are retried by the XMTP workers through the queue (the retry
    # settings apply to every channel's). The Matrix gateway keeps its own numbers, Sygnal's.
    retry: RetryPolicy
    # The largest payload its provider takes, in bytes (`payload_size`); None: the provider decides
    # alone. A source that renders once for many pushes refuses them all here, before queueing them.
    max_payload_bytes: int | None = None

    def refuses_size_of(self, push: Push) -> bool:
        return self.max_payload_bytes is not None and payload_size(push.payload) > self.max_payload_bytes


def describe(
    label: str,
    credentials: type[C],
    provider: Callable[Concatenate[C, float, ...], Provider],
    default_app: DefaultApp[C] | None,
    color: str,
    retry: RetryPolicy,
    max_payload_bytes: int | None = None,
) -> ChannelDescriptor[Any]:
    """A channel's descriptor, its parts checked against each other (as a function, so that the
    table's own type does not stand in for the credentials')."""
    return ChannelDescriptor(label, credentials, provider, default_app, color, retry, max_payload_bytes)


APNS_SETTINGS = (*APNS_REQUIRED, "apns_environment", "apns_endpoint", "apns_ca_file")
WEBHOOK_SETTINGS = (
    *WEBHOOK_REQUIRED,
    "webhook_allowed_domains",
    "webhook_allow_private_addresses",
    "webhook_allow_insecure",
    "webhook_proxy",
    "webhook_max_per_host",
    "webhook_max_per_fast_host",
)

CHANNELS: dict[Channel, ChannelDescriptor[Any]] = {
    Channel.APNS: describe(
        "APNs",
        ApnsCredentials,
        ApnsProvider,
        DefaultApp(APNS_SETTINGS, APNS_REQUIRED, apns_credentials),
        "#1f77b4",
        RetryPolicy(),
        max_payload_bytes=APNS_MAX_BODY_BYTES,
    ),
    Channel.FCM: describe(
        "FCM",
        FcmCredentials,
        FcmProvider,
        DefaultApp((*FCM_REQUIRED, "fcm_endpoint"), FCM_REQUIRED, fcm_credentials),
        "#ff7f0e",
        RetryPolicy(floor_seconds=FCM_RETRY_FLOOR_SECONDS),
    ),
    Channel.HTTP: describe(
        "webhooks",
        WebhookConfig,
        WebhookProvider.from_config,
        DefaultApp(WEBHOOK_SETTINGS, WEBHOOK_REQUIRED, webhook_config),
        "#2ca02c",
        RetryPolicy(),
    ),
    Channel.WEBPUSH: describe("Web Push", WebPushConfig, WebPushProvider, None, "#17becf", RetryPolicy()),
}
# The channels whose default app the flat settings configure.
FLAT_CHANNELS = {channel: d.default_app for channel, d in CHANNELS.items() if d.default_app is not None}

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
    configured = ((channel, default.load(settings)) for channel, default in FLAT_CHANNELS.items())
    return [ChannelApp(channel, DEFAULT_APP, c) for channel, c in configured if c is not None]


def refuse_half_set_channels(settings: Settings) -> None:
    """At start-up and in `config check`: a channel with some of its settings set but not all is a
    mistake, not "not configured" (SettingsError naming what is missing)."""
    for default in FLAT_CHANNELS.values():
        default.refuse_half_set(settings)


def ways_to_configure(channels: Iterable[Channel]) -> str:
    """What configures any of `channels`, for messages: "XMTP_PUSH_FCM_SERVICE_ACCOUNT (FCM), or ..."."""
    ways = [
        f"{default.configured_by} ({CHANNELS[c].label})"
        for c in channels
        if (default := FLAT_CHANNELS.get(c))
    ]
    return ", or ".join(filter(None, (", ".join(ways[:-1]), ways[-1])))


def log_outcome(channel: Channel, outcome: Outcome, seconds: float) -> None:
    """Log one attempt by channel, outcome, duration and cause (a constant, or a provider's code: what
    an operator acts on): never the push, its address or the reply."""
    level = OUTCOME_LEVELS[outcome.kind]
    if not log.isEnabledFor(level):
        return
    retry = f", retry after {outcome.delay_seconds:.0f} s" if outcome.delay_seconds else ""
    pause = " (channel paused)" if outcome.pause_channel else ""
    cause = f": {outcome.reason}" if outcome.reason else ""
    log.log(
        level,
        "%s attempt %s in %.0f ms%s%s%s",
        channel,
        outcome.kind.value,
        seconds * 1000,
        cause,
        retry,
        pause,
        extra={"channel": channel, "outcome": outcome.kind.value},
    )
