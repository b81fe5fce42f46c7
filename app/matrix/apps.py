"""The gateway's apps: one per key of the config's `apps:` section, found by a device's app id.

An app key is an exact app id or a glob (`*` any run of characters, `?` one); an exact key wins,
and an app id that two globs match is ambiguous (as Sygnal: its pushkey is rejected). Each app
type (apns, gcm, ...) is one module with an `AppType`: the config keys it reads, and how it makes
its app from them; `app.matrix.config.APP_TYPES` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.apps import AppName, AppSource
from app.core.channels import Channel
from app.core.config import ENV_PREFIX, SettingsError
from app.delivery.registry import ChannelApp, ChannelCredentials
from app.delivery.types import OutcomeKind, Push
from app.delivery.url_policy import UrlPolicy
from app.matrix.notification import Device, Notification

DEFAULT_INFLIGHT_REQUEST_LIMIT = 512


class RejectDevice(Exception):
    """This device's pushkey is permanently unusable: it goes in `rejected`. The message says why
    without any value from the request."""


# How an app turns one notification for one device into the push its channel sends; None when
# there is nothing to send (a full-format event with no alert and no count, or a badge-only update
# of an app that sends no counts).
Renderer = Callable[[Notification, Device], Push | None]


@dataclass(frozen=True, slots=True)
class MatrixApp:
    app_id: str  # the configured key: an exact app id or a glob
    type: str  # apns | gcm | ...
    channel: Channel  # the delivery channel whose provider sends for it
    credentials: ChannelCredentials  # as that channel's provider takes them
    render: Renderer
    # Provider outcomes that mean the token is dead for good: its pushkey is rejected.
    rejecting: frozenset[OutcomeKind]
    inflight_request_limit: int = DEFAULT_INFLIGHT_REQUEST_LIMIT

    @property
    def provider_app(self) -> AppName:
        return AppName(AppSource.MATRIX, self.app_id)

    def channel_app(self) -> ChannelApp:
        return ChannelApp(self.channel, self.provider_app, self.credentials)


class AppValues:
    """One app's config values, read with type checks; errors name the app and the key."""

    def __init__(self, app_id: str, values: Mapping[str, Any], url_policy: UrlPolicy | None = None) -> None:
        self.app_id, self.values = app_id, values
        # Which URLs an app may have pushes posted to (webpush endpoints): the webhooks' rules.
        self.url_policy = url_policy or UrlPolicy()

    def name(self, key: str) -> str:
        return f"{ENV_PREFIX}MATRIX_APPS: apps.{self.app_id}.{key}"

    def error(self, key: str, problem: str) -> SettingsError:
        return SettingsError(f"{self.name(key)}: {problem}")

    def get(self, key: str, kind: type, default: Any = None, *, required: bool = False) -> Any:
        value = self.values.get(key)
        if value is None:
            if required:
                raise self.error(key, "required")
            return default
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(key, f"must be {KIND_NAMES[kind]}")
        return value

    def positive(self, key: str, default: int) -> int:
        value: int = self.get(key, int, default)
        if value < 1:
            raise self.error(key, "must be at least 1")
        return value

    def choice(self, key: str, choices: Iterable[str], default: str | None = None) -> str | None:
        value: str | None = self.get(key, str, default)
        allowed = list(choices)
        if value is not None and value not in allowed:
            raise self.error(key, f"must be one of {', '.join(allowed)}")
        return value


KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping"}


@dataclass(frozen=True, slots=True)
class AppType:
    keys: frozenset[str]  # the keys it reads, beyond `type` and `inflight_request_limit`
    make: Callable[[AppValues], MatrixApp]


class AppTable:
    """Apps by exact id, then by glob."""

    def __init__(self, apps: Iterable[MatrixApp]) -> None:
        self.apps = list(apps)
        self._exact = {app.app_id: app for app in self.apps}
        self._globs = [(glob_pattern(app.app_id), app) for app in self.apps if is_glob(app.app_id)]

    def find(self, app_id: str) -> MatrixApp | None:
        """The app serving `app_id`; None when no app does or two globs do (ambiguous)."""
        exact = self._exact.get(app_id)
        if exact is not None:
            return exact
        found = [app for pattern, app in self._globs if pattern.fullmatch(app_id)]
        return found[0] if len(found) == 1 else None

    def channel_apps(self) -> list[ChannelApp]:
        return [app.channel_app() for app in self.apps]


def is_glob(app_id: str) -> bool:
    return "*" in app_id or "?" in app_id


def glob_pattern(glob: str) -> re.Pattern[str]:
    """`*` any run of characters, `?` exactly one, everything else literal; case-sensitive."""
    parts = {"*": ".*", "?": "."}
    return re.compile("".join(parts.get(char) or re.escape(char) for char in glob), re.DOTALL)
