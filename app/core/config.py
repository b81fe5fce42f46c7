"""The one typed settings object, read from XMTP_PUSH_* variables or a TOML file."""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.core.auth_settings import AuthSettings
from app.core.legacy_settings import LegacySettings
from app.core.proxies import parse_proxy_url
from app.core.quota_settings import QuotaSettings
from app.core.renamed_settings import (
    RENAMED_SETTINGS,
    OldNamesRead,
    RenamedSettingConflict,
    old_variables,
    renamed_setting_warnings,
)

ENV_PREFIX = "XMTP_PUSH_"
# Every request in and every request out is bounded by this (SDKs give up at 30 s).
MAX_CALL_SECONDS = 30.0
MALFORMED_URL = "not a well-formed URL (check the host, the port and that special characters are %-escaped)"
# Relays send nothing while no trigger comes; we ping every half of this, so a minute notices a
# dead connection (a half-open TCP link, a relay that stopped answering) within two missed pings.
MARMOT_RELAY_WATCHDOG_SECONDS = 60.0
# A 32-chunk trigger makes a gift wrap of about 120 KiB; no frame a relay sends us may be larger.
MARMOT_MAX_FRAME_BYTES = 256 * 1024
# The flat settings that, all set, configure a channel's default app (app.delivery.registry.CHANNELS).
APNS_REQUIRED = ("apns_key", "apns_key_id", "apns_team_id", "apns_bundle_id")
FCM_REQUIRED = ("fcm_service_account",)
WEBHOOK_REQUIRED = ("webhook_enabled",)
# The retry settings' defaults, which are a channel's retry policy's too.
RETRY_BASE_SECONDS = 1.0
RETRY_WINDOW_SECONDS = 3600.0
MAX_ATTEMPTS = 15

log = logging.getLogger("app.core.config")


def _split_domains(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip().lower() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        return tuple(str(part).strip().lower() for part in value if str(part).strip())
    return value


class SettingsError(Exception):
    """A setting has a bad value; the message names the setting, never its value."""


class Settings(AuthSettings, QuotaSettings, LegacySettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    database_url: str = "sqlite+aiosqlite:///./xmtp-push.db"
    redis_url: str | None = None
    # A new database connection is given up after this: an outage answers UNAVAILABLE quickly.
    database_connect_timeout_seconds: float = Field(5.0, gt=0, le=MAX_CALL_SECONDS)
    # A PostgreSQL read replica for fan-out pages and delivery-target lookups; writes stay on DATABASE_URL.
    database_read_url: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # Where `worker` and `listen` serve /healthz, /readyz and /metrics (on HTTP_HOST); 0 picks a free
    # port. Processes sharing a host each need their own (or 0).
    metrics_port: int = Field(9464, ge=0, le=65535)
    ingest_token: str | None = None
    # The largest POST /v1/envelopes body taken in; a larger one is refused while it streams.
    ingest_max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # uvloop runs the long-running processes' event loops (where installed); "asyncio" is the standard one.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Allocations between collections of the young generation in the long-running processes
    # (Python's default is 700, which made the collector a large share of a busy worker's CPU).
    gc_young_threshold: int = Field(20_000, ge=100, le=1_000_000)

    recipient_ttl_seconds: int = Field(2_592_000, ge=86_400)
    # The retry policy of every channel (app.delivery.retry.RetryPolicy): transient failures are
    # retried from the base delay, doubling, for the window, and at most this many attempts in all.
    retry_base_seconds: float = Field(RETRY_BASE_SECONDS, gt=0, le=60)
    max_attempts: int = Field(MAX_ATTEMPTS, ge=1, le=50)
    retry_window_seconds: float = Field(RETRY_WINDOW_SECONDS, ge=0, le=86_400)
    max_push_topics: int = Field(100_000, ge=1)
    sweep_interval_seconds: float = Field(900.0, gt=0, le=3600)
    request_timeout_seconds: float = Field(MAX_CALL_SECONDS, gt=0, le=MAX_CALL_SECONDS)

    apns_key: str | None = None
    apns_key_id: str | None = None
    apns_team_id: str | None = None
    apns_bundle_id: str | None = None
    apns_environment: Literal["production", "sandbox"] = "production"
    apns_endpoint: str | None = None
    apns_ca_file: str | None = None

    fcm_service_account: str | None = None
    fcm_endpoint: str = "https://fcm.googleapis.com"

    # Every request to a provider (APNs, FCM, a webhook's receiver) of the flat settings' apps is
    # bounded by this; the Matrix gateway's apps by MATRIX_REQUEST_TIMEOUT_SECONDS.
    provider_timeout_seconds: float = Field(10.0, gt=0, le=MAX_CALL_SECONDS)

    webhook_enabled: bool = False
    # Part of the type, not a validator of the model's: a renamed setting's two values are read alike.
    webhook_allowed_domains: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_domains)] = ()
    webhook_allow_private_addresses: bool = False
    webhook_allow_insecure: bool = False
    # Webhook attempts in flight to one host (host and port) per worker; more wait in the queue.
    webhook_max_per_host: int = Field(16, ge=1, le=4096)

    # Egress proxies (app.delivery.egress): provider traffic follows the environment's own variables,
    # read here unprefixed; webhooks to receivers go through a proxy only when this names one.
    # Secret: the URL may hold the proxy's password.
    https_proxy: SecretStr | None = Field(None, validation_alias=AliasChoices("https_proxy", "HTTPS_PROXY"))
    no_proxy: str | None = Field(None, validation_alias=AliasChoices("no_proxy", "NO_PROXY"))
    webhook_proxy: SecretStr | None = None

    # Delivery pipeline tuning.
    delivery_concurrency: int = Field(256, ge=1, le=4096)  # in flight per channel per worker
    fanout_concurrency: int = Field(4, ge=1, le=64)
    fanout_page_size: int = Field(1000, ge=1, le=10_000)
    # A topic whose first page is full is fanned out as this many recipient-id ranges in parallel.
    fanout_ranges: int = Field(16, ge=1, le=256)
    # An entry left pending this long by a worker that died is taken over by another.
    # Longer than the 30 s bound on any attempt, so live work is not taken twice.
    queue_reclaim_seconds: float = Field(60.0, gt=0)
    # The queue's work is split into this many partitions (hash tags); fixed once work is queued.
    queue_partitions: int = Field(64, ge=1, le=16384)
    # A Redis Cluster at REDIS_URL: "auto" asks the server (INFO cluster).
    redis_cluster: Literal["auto", "true", "false"] = "auto"
    # Connections to each Redis node per process; a call finding all busy waits for one.
    redis_max_connections: int = Field(64, ge=1, le=10_000)
    dedup_ttl_seconds: int = Field(86_400, ge=60)

    # The Matrix push gateway: a Sygnal-style YAML file of apps enables /_matrix/push/v1/notify.
    matrix_apps: str | None = None
    # Every notify request is answered within this, short retries included (homeservers time out).
    matrix_request_timeout_seconds: float = Field(10.0, gt=0, le=MAX_CALL_SECONDS)

    xmtpd_address: str | None = None
    xmtpd_tls: bool = True
    xmtpd_keepalive_timeout_seconds: float = Field(90.0, gt=0)
    xmtpd_catchup_max_age_seconds: float = Field(600.0, ge=0)

    # The Marmot notification server (`xmtp-push marmot`): its Nostr key (64 hex characters, nsec1...,
    # or a path to a file holding either; read by app.marmot.keys) and the relays it listens on.
    marmot_secret_key: SecretStr | None = None
    marmot_relays: Annotated[tuple[str, ...], NoDecode] = ()
    # ws:// relays (no TLS: anyone on the path reads and alters the traffic) are refused at start
    # unless allowed: a relay on this host or a trusted network, say.
    marmot_allow_unencrypted_relays: bool = False
    # Transponder's tiers: gift wraps taken in (before unwrapping), per encrypted chunk, per device.
    marmot_global_per_minute: int = Field(600, ge=1)
    marmot_global_per_hour: int = Field(30_000, ge=1)
    marmot_chunk_per_minute: int = Field(240, ge=1)
    marmot_chunk_per_hour: int = Field(5_000, ge=1)
    marmot_device_per_minute: int = Field(240, ge=1)
    marmot_device_per_hour: int = Field(5_000, ge=1)
    marmot_max_concurrent: int = Field(64, ge=1, le=4096)  # triggers processed at once
    # Live triggers waiting for a handler (a relay's reader never waits for one), each charged its
    # frame's length; one that does not fit is refused as rate limited. 64 MiB: ~13,000 one-token gift
    # wraps (~5 KiB), ~550 of 32 tokens (~120 KiB). At least one frame of the largest size.
    marmot_pending_bytes: int = Field(64 * 1024 * 1024, ge=MARMOT_MAX_FRAME_BYTES)
    # Pushes in flight per channel (APNs, FCM); more wait for a slot.
    marmot_pushes_in_flight: int = Field(32, ge=1, le=4096)
    marmot_dedup_seconds: float = Field(300.0, ge=1, le=86_400)
    # A relay connection silent this long (our pings unanswered included) is closed and reopened.
    marmot_relay_watchdog_seconds: float = Field(MARMOT_RELAY_WATCHDOG_SECONDS, ge=1, le=3600)
    # What a Marmot APNs push shows (FCM stays data-only): "silent" wakes the app (content-available,
    # background, priority 5); "generic_alert" shows the title and body below (push type alert,
    # priority 10); "mutable_alert" the same with mutable-content 1, for a notification service
    # extension to rewrite it. An empty body is left out.
    marmot_apns_mode: Literal["silent", "generic_alert", "mutable_alert"] = "silent"
    marmot_alert_title: str = Field("New message", min_length=1, max_length=256)
    marmot_alert_body: str = Field("", max_length=1024)
    # apns-collapse-id on every Marmot APNs push: a newer one replaces an older one still shown.
    # Printable ASCII, at most APNs' 64 bytes.
    marmot_apns_collapse_id: str | None = Field(None, pattern=r"^[ -~]{1,64}$")

    @field_validator("marmot_relays", mode="before")
    @classmethod
    def _split_relays(cls, value: Any) -> Any:
        parts = value.split(",") if isinstance(value, str) else value
        if not isinstance(parts, list | tuple):
            return value
        relays = dict.fromkeys(str(part).strip() for part in parts if str(part).strip())
        for relay in relays:
            if not _is_relay_url(relay):
                raise ValueError("each relay must be a ws:// or wss:// URL with a host")
        return tuple(relays)

    @field_validator("https_proxy", "webhook_proxy")
    @classmethod
    def _check_proxy(cls, value: SecretStr | None) -> SecretStr | None:
        text = value.get_secret_value().strip() if value is not None else ""
        if not text:
            return None
        parse_proxy_url(text)  # its ValueError never quotes the URL
        return SecretStr(text)

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL")
        _check_url_shape(value)
        try:
            make_url(value)
        except (ArgumentError, ValueError):
            raise ValueError(MALFORMED_URL) from None
        return value

    @field_validator("database_read_url")
    @classmethod
    def _check_database_read_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if not value:
            return None
        if not value.startswith("postgresql+asyncpg://"):
            raise ValueError("must be a postgresql+asyncpg:// URL (a read replica; SQLite has none)")
        if str(info.data.get("database_url", "")).startswith("sqlite"):
            raise ValueError(f"a read replica needs {ENV_PREFIX}DATABASE_URL on PostgreSQL, not SQLite")
        return cls._check_database_url(value)

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        if value:
            _check_url_shape(value)
        return value or None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        variables = partial(old_variables, ENV_PREFIX, os.environ)
        sources = [OldNamesRead(init_settings, str), OldNamesRead(env_settings, _variable, variables)]
        config_file = os.environ.get(f"{ENV_PREFIX}CONFIG")
        if config_file:
            toml = TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file))
            sources.append(OldNamesRead(toml, _file_key))
        return tuple(sources)

    def all_set(self, names: tuple[str, ...]) -> bool:
        """Every setting named is set (a channel's required ones: its default app is configured)."""
        return all(getattr(self, name) for name in names)

    @property
    def apns_configured(self) -> bool:
        return self.all_set(APNS_REQUIRED)

    @property
    def fcm_configured(self) -> bool:
        return self.all_set(FCM_REQUIRED)

    @property
    def marmot_configured(self) -> bool:
        return self.marmot_secret_key is not None and bool(self.marmot_secret_key.get_secret_value())

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def _check_url_shape(value: str) -> None:
    """A URL whose host or port cannot be read is refused here, not as a traceback at first use.
    The message never quotes the URL: it may hold a password."""
    try:
        urlsplit(value).port  # noqa: B018 - reading it validates it
    except ValueError:
        raise ValueError(MALFORMED_URL) from None


def _is_relay_url(text: str) -> bool:
    try:
        _check_url_shape(text)
    except ValueError:
        return False
    parsed = urlsplit(text)
    return parsed.scheme in ("ws", "wss") and bool(parsed.hostname) and not any(c.isspace() for c in text)


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning a validation failure into a message naming each bad setting."""
    config_file = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if config_file and not Path(config_file).is_file():
        raise SettingsError(f"{ENV_PREFIX}CONFIG: file not found")
    for warning in renamed_setting_warnings(ENV_PREFIX, _environment(), _file_keys()):
        log.warning("%s", warning)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except RenamedSettingConflict as exc:
        raise SettingsError(str(exc)) from None
    except tomllib.TOMLDecodeError:
        raise SettingsError(f"{ENV_PREFIX}CONFIG: not a valid TOML file") from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        message = error["msg"].removeprefix("Value error, ")
        # A check across settings names its setting itself.
        problems.append(f"{_source_name(field)}: {message}" if field else message)
    return "invalid configuration: " + "; ".join(problems)


def _source_name(field: str) -> str:
    """Where a bad value came from: the environment variable (which wins) or the TOML file's key,
    under the name it was given (a renamed setting's old one included)."""
    names = [field, *(old for old, new in RENAMED_SETTINGS.items() if new == field)]
    environment, file_keys = _environment(), _file_keys()
    variables = [_variable(name) for name in names if _variable(name) in environment]
    keys = [_file_key(name) for name in names if name in file_keys]
    return (variables or keys or [_variable(field)])[0]


def _variable(field: str) -> str:
    return UNPREFIXED_SETTINGS.get(field, ENV_PREFIX + field.upper())


def _file_key(field: str) -> str:
    return f"{field} (in the {ENV_PREFIX}CONFIG file)"


def _environment() -> set[str]:
    return {name.upper() for name in os.environ}


def _file_keys() -> set[str]:
    return {key.lower() for key in _toml_keys()}


def _toml_keys() -> set[str]:
    config_file = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if not config_file:
        return set()
    try:
        return set(tomllib.loads(Path(config_file).read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return set()


# Settings read from the environment's usual variables, without the prefix.
UNPREFIXED_SETTINGS = {"https_proxy": "HTTPS_PROXY", "no_proxy": "NO_PROXY"}
# XMTP_PUSH_ variables read elsewhere than the settings: the file's name, and the test suite's servers.
_NOT_SETTINGS = frozenset({f"{ENV_PREFIX}CONFIG"})
_TEST_VARIABLES = f"{ENV_PREFIX}TEST_"


def unknown_setting_warnings() -> list[str]:
    """A warning for each XMTP_PUSH_ variable and each TOML key that is no setting, with the nearest
    setting's name: a mistyped name would otherwise be ignored in silence."""
    fields = sorted(set(Settings.model_fields) - set(UNPREFIXED_SETTINGS))
    names = [*fields, *RENAMED_SETTINGS]  # an old name is read, and warned about as such
    variables = {ENV_PREFIX + name.upper() for name in names}
    warnings = []
    for name in sorted(_environment()):
        known = name in variables or name in _NOT_SETTINGS or name.startswith(_TEST_VARIABLES)
        if name.startswith(ENV_PREFIX) and not known:
            nearest = _nearest(name.removeprefix(ENV_PREFIX).lower(), names)
            hint = f" (did you mean {ENV_PREFIX}{nearest.upper()}?)" if nearest else ""
            warnings.append(f"{name} is not a setting and is ignored{hint}")
    for key in sorted(key for key in _toml_keys() if key.lower() not in names):  # as case-blind as pydantic
        nearest = _nearest(key.lower(), names)
        hint = f" (did you mean {nearest}?)" if nearest else ""
        warnings.append(f"{key} (in the {ENV_PREFIX}CONFIG file) is not a setting and is ignored{hint}")
    return warnings


def _nearest(name: str, known: list[str]) -> str | None:
    """The known name nearest to `name`; near an old name, that setting's new name."""
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return RENAMED_SETTINGS.get(matches[0], matches[0]) if matches else None
