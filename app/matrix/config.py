"""The gateway's config file (XMTP_PUSH_MATRIX_APPS): a whole `sygnal.yaml`, or one holding only `apps:`.

`apps:`, `proxy:` (the egress proxy of the apps' connections, app.delivery.egress) and `http:` (where
`xmtp-push gateway` listens unless the HTTP settings say) are read; any other top-level section
(Sygnal's `log`, `metrics`...) is named in one warning and ignored. Each app is checked and its
credentials loaded here, at start-up: a missing or bad key stops start-up with a message naming the
app and the key (never a secret's value); a key its type does not know is a warning naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.core.config import ENV_PREFIX, Settings, SettingsError
from app.core.proxies import parse_proxy_url
from app.delivery.url_policy import UrlPolicy
from app.matrix import apns_app, gcm_app, webpush_app
from app.matrix.apps import DEFAULT_INFLIGHT_REQUEST_LIMIT, AppTable, AppType, AppValues, MatrixApp

SETTING = f"{ENV_PREFIX}MATRIX_APPS"
MAX_APP_ID_LENGTH = 64
# App types by the name a config's `type:` gives them. A new type plugs in here:
# one module with its AppType (keys, and how its app is made and renders a push), one line.
APP_TYPES: dict[str, AppType] = {
    "apns": apns_app.APP_TYPE,
    "gcm": gcm_app.APP_TYPE,
    "webpush": webpush_app.APP_TYPE,
}
COMMON_KEYS = frozenset({"type", "inflight_request_limit"})
READ_SECTIONS = frozenset({"apps", "proxy", "http"})
# Where Sygnal listens when its `http:` section does not say.
SYGNAL_BIND_ADDRESSES: tuple[str, ...] = ("127.0.0.1",)
SYGNAL_PORT = 5000
HTTP_KEYS = frozenset({"bind_addresses", "port"})


@dataclass(frozen=True, slots=True)
class HttpSection:
    """The file's `http:` section as Sygnal reads it; None where it does not say."""

    bind_addresses: tuple[str, ...] | None = None
    port: int | None = None


@dataclass(frozen=True, slots=True)
class GatewayAddress:
    """Where `xmtp-push gateway` listens, and what chose it (said at start-up)."""

    hosts: tuple[str, ...]
    port: int
    hosts_from: str  # the setting, the file's key, or Sygnal's default
    port_from: str

    @property
    def chosen_by(self) -> str:
        return f"{self.hosts_from}, {self.port_from}"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    apps: AppTable
    # Said once at start-up (ignored sections, unknown keys); never a value.
    warnings: list[str] = field(default_factory=list)
    # `proxy:`, as Sygnal reads it: the apps' connections go through it (HTTPS_PROXY otherwise).
    proxy: str | None = field(default=None, repr=False)
    http: HttpSection = HttpSection()


def load_gateway_config(path: str, url_policy: UrlPolicy | None = None) -> GatewayConfig:
    """The apps of the file at `path`, credentials loaded; SettingsError names what is wrong.
    `url_policy`: the URLs pushes may be posted to (webpush endpoints); default https to public
    addresses only."""
    document = _read(path)
    warnings: list[str] = []
    ignored = sorted(str(key) for key in document if key not in READ_SECTIONS)
    if ignored:
        warnings.append(
            f"{SETTING}: only the apps, proxy and http sections are read; ignored: {', '.join(ignored)}"
        )
    http = _http(document.get("http"), warnings)
    apps_section = document.get("apps")
    if not isinstance(apps_section, dict) or not apps_section:
        raise SettingsError(f"{SETTING}: the file has no apps: section (a mapping of app ids)")
    apps = [_app(str(app_id), values, warnings, url_policy) for app_id, values in apps_section.items()]
    return GatewayConfig(AppTable(apps), warnings, _proxy(document.get("proxy")), http)


def read_http_section(path: str) -> HttpSection:
    """The `http:` section of the file at `path` alone (no app is loaded); SettingsError when bad."""
    return _http(_read(path).get("http"), [])


def gateway_address(settings: Settings, http: HttpSection) -> GatewayAddress:
    """Where `xmtp-push gateway` listens: XMTP_PUSH_HTTP_HOST and XMTP_PUSH_HTTP_PORT when they are
    set, else the file's `http:` section, else Sygnal's defaults, so that it answers where Sygnal
    did with the same file."""
    given = settings.model_fields_set
    hosts: tuple[str, ...]
    if "http_host" in given:
        hosts, host_from = (settings.http_host,), f"{ENV_PREFIX}HTTP_HOST"
    elif http.bind_addresses is not None:
        hosts, host_from = http.bind_addresses, f"http.bind_addresses of {SETTING}"
    else:
        hosts, host_from = SYGNAL_BIND_ADDRESSES, "Sygnal's default address"
    if "http_port" in given:
        port, port_from = settings.http_port, f"{ENV_PREFIX}HTTP_PORT"
    elif http.port is not None:
        port, port_from = http.port, f"http.port of {SETTING}"
    else:
        port, port_from = SYGNAL_PORT, "Sygnal's default port"
    return GatewayAddress(hosts, port, host_from, port_from)


def _http(section: Any, warnings: list[str]) -> HttpSection:
    if section is None:
        return HttpSection()
    if not isinstance(section, dict):
        raise SettingsError(f"{SETTING}: http: must be a mapping (bind_addresses, port)")
    unknown = sorted(str(key) for key in section if key not in HTTP_KEYS)
    if unknown:
        warnings.append(f"{SETTING}: http: unknown keys ignored: {', '.join(unknown)}")
    addresses, port = section.get("bind_addresses"), section.get("port")
    if addresses is not None and (
        not isinstance(addresses, list)
        or not addresses
        or not all(isinstance(a, str) and a for a in addresses)
    ):
        raise SettingsError(f"{SETTING}: http.bind_addresses: must be a list of addresses")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise SettingsError(f"{SETTING}: http.port: must be a port number (0 to 65535)")
    return HttpSection(tuple(addresses) if addresses is not None else None, port)


def _proxy(value: Any) -> str | None:
    if value is None:
        return None
    try:
        parse_proxy_url(value if isinstance(value, str) else "")
    except ValueError as error:
        raise SettingsError(f"{SETTING}: proxy: {error}") from None
    return str(value).strip()


def _read(path: str) -> Mapping[Any, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise SettingsError(f"{SETTING}: file not found or not readable") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        raise SettingsError(f"{SETTING}: not a valid YAML file") from None
    if not isinstance(document, dict):
        raise SettingsError(f"{SETTING}: the file must hold a mapping with an apps: section")
    return document


def _app(app_id: str, raw: Any, warnings: list[str], url_policy: UrlPolicy | None) -> MatrixApp:
    values = AppValues(app_id, raw if isinstance(raw, dict) else {}, url_policy)
    if not isinstance(raw, dict):
        raise SettingsError(f"{SETTING}: apps.{app_id}: must be a mapping of keys")
    if len(app_id) > MAX_APP_ID_LENGTH:
        raise SettingsError(f"{SETTING}: apps.{app_id}: an app id has at most {MAX_APP_ID_LENGTH} characters")
    type_name = values.choice("type", APP_TYPES)
    if type_name is None:
        raise values.error("type", f"required: one of {', '.join(APP_TYPES)}")
    app_type = APP_TYPES[type_name]
    unknown = sorted(str(key) for key in raw if key not in app_type.keys | COMMON_KEYS)
    if unknown:
        warnings.append(f"{SETTING}: apps.{app_id}: unknown keys ignored: {', '.join(unknown)}")
    limit = values.positive("inflight_request_limit", DEFAULT_INFLIGHT_REQUEST_LIMIT)
    if type_name == "webpush" and "allowed_endpoints" not in raw:
        # Sygnal too posts to any endpoint a pusher names: anyone's server, at our expense.
        warnings.append(
            f"{values.name('allowed_endpoints')}: not set, so this webpush app posts to any endpoint a "
            "pusher names; list the push services it accepts"
        )
    return dataclasses.replace(app_type.make(values), inflight_request_limit=limit)
