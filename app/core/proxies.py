"""An egress proxy's URL, read from the settings: `http://[user:password@]host:port`.

Here, below the settings, so they can refuse a malformed one at start-up; app.delivery.egress uses it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

MALFORMED_PROXY = "must be an http:// proxy URL with a host, as http://[user:password@]host:port"


@dataclass(frozen=True, slots=True)
class Proxy:
    host: str
    port: int
    # The Proxy-Authorization value for `user:password@` in the URL; never printed.
    authorization: str | None = field(default=None, repr=False)
    userinfo: str = field(default="", repr=False)  # "user:password@" as written, for `requests`

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The proxy's URL without its credentials (they go in `headers`)."""
        return f"http://{self.address}"

    @property
    def url_with_credentials(self) -> str:
        return f"http://{self.userinfo}{self.address}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def __str__(self) -> str:
        return self.address


def parse_proxy_url(text: str) -> Proxy:
    """The proxy of a URL (a bare host:port is taken as http://); ValueError that never quotes it."""
    text = text.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port or 80
    except ValueError:
        raise ValueError(MALFORMED_PROXY) from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(MALFORMED_PROXY)
    if parts.username is None:
        return Proxy(parts.hostname, port)
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@"
    return Proxy(parts.hostname, port, "Basic " + base64.b64encode(pair).decode(), userinfo)
