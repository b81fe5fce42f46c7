"""What a failed attempt met, in words for an operator: the providers put it in their outcome's
`reason`, and the Matrix gateway logs it when an app's pushes start failing.

Constant text and the provider's own codes only: never a host, URL, token, key or the provider's
free-text message (which may quote what it was sent).
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterator

DNS = "DNS: the host name does not resolve"
REFUSED = "connection refused"
TLS = "TLS handshake failed (is the certificate trusted?)"
TIMEOUT = "timed out: no answer in time"
RESET = "the connection was closed before an answer"
# A provider's code as it may be told: APNs's reasons (BadDeviceToken), FCM's error codes
# (QUOTA_EXCEEDED) and statuses (PERMISSION_DENIED); anything else is left out.
PROVIDER_CODE = re.compile(r"[A-Za-z][A-Za-z_]{0,63}")
# How far along an error's causes to look.
MAX_LINKS = 16


def connection_cause(error: BaseException) -> str:
    """What a request that got no answer met, found along the error's causes."""
    for link in _links(error):
        if isinstance(link, socket.gaierror):
            return DNS
        if isinstance(link, ConnectionRefusedError):
            return REFUSED
        if isinstance(link, ssl.SSLError):  # a certificate that does not verify among them
            return TLS
        if isinstance(link, TimeoutError):
            return TIMEOUT
        if isinstance(link, ConnectionResetError | BrokenPipeError):
            return RESET
    return f"the connection failed ({type(error).__name__})"


def http_cause(status: int | str, code: str | None = None) -> str:
    """An answer's status and the provider's code for it: `HTTP 400 BadDeviceToken`."""
    told = code if code and PROVIDER_CODE.fullmatch(code) else None
    return f"HTTP {status} {told}" if told else f"HTTP {status}"


def credentials_refused(cause: str) -> str:
    return f"credentials refused ({cause})"


def _links(error: BaseException) -> Iterator[BaseException]:
    """The error and what caused it: Python's chain, and the `cause` attribute firebase-admin's
    errors keep theirs in."""
    current: BaseException | None = error
    for _ in range(MAX_LINKS):
        if current is None:
            return
        yield current
        held = getattr(current, "cause", None)
        current = (
            current.__cause__ or (held if isinstance(held, BaseException) else None) or current.__context__
        )
