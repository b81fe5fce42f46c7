"""Structured JSON logs, one object per line, with nothing sensitive in them.

Our own log calls carry only counts, channel names and status names. More
guards cover what we do not write ourselves, because driver and library
messages can quote parameters (ids, tokens, URLs): values under sensitive keys
are replaced; URLs and long hex runs (ids, keys, hashes) in any message are
replaced; asyncio's reports keep only their first line (the rest is the repr of
a task or callback and its arguments); loggers that print statements or
requests at their lower levels are held above them; and an exception is logged
by its type and frames only.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import MutableMapping
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import structlog

REDACTED = "[redacted]"
SENSITIVE_KEYS = frozenset(
    {"authorization", "key", "recipient_id", "secret", "signing_key", "target", "token", "topic", "url"}
)
# Libraries whose lower levels log request lines or addresses.
QUIET_LOGGERS = {
    "aioapns": logging.CRITICAL,
    "aiosqlite": logging.INFO,  # DEBUG prints every statement with its parameters
    "alembic.runtime.plugins": logging.WARNING,
    "firebase_admin": logging.INFO,  # DEBUG prints each request with its URL
    "google": logging.WARNING,
    "h2": logging.WARNING,
    "hpack": logging.WARNING,
    "httpcore": logging.WARNING,
    "httpx": logging.WARNING,
    "urllib3": logging.WARNING,
}
# scheme://anything-up-to-whitespace-or-quote, and 32+ hex digits (a 16-byte value or longer).
URL_PATTERN = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
HEX_PATTERN = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{32,}(?![0-9a-fA-F])")
URL_REDACTED = "[url]"
HEX_REDACTED = "[hex]"
# A request's ids (app/api/request_ids.py), on its lines: what an operator looks for, so a long hex
# run in them stays (a trace id is one); URLs are still replaced.
REQUEST_KEYS = frozenset({"request_id", "trace_id"})
# The HTTP request being answered in this task: its request id and its trace id (or None), as sent.
# One context variable set per request (cheaper than binding structlog's, per key), read only when a
# line is written.
request_ids: ContextVar[tuple[bytes, bytes | None] | None] = ContextVar("request_ids", default=None)
# Loggers whose multi-line messages carry reprs after the first line.
FIRST_LINE_ONLY = frozenset({"asyncio"})
EventDict = MutableMapping[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def add_request_ids(_logger: Any, _method: str, event: EventDict) -> EventDict:
    ids = request_ids.get()
    if ids is not None:
        event["request_id"] = ids[0].decode()
        if ids[1] is not None:
            event["trace_id"] = ids[1].decode()
    return event


def redact_sensitive(_logger: Any, _method: str, event: EventDict) -> EventDict:
    event.pop("color_message", None)  # uvicorn's terminal copy of the message
    for name in list(event):
        if name.lower() in SENSITIVE_KEYS:
            event[name] = REDACTED
    return event


def scrub(text: str) -> str:
    return HEX_PATTERN.sub(HEX_REDACTED, URL_PATTERN.sub(URL_REDACTED, text))


def scrub_messages(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """Replace URLs and long hex runs in every string value (the message and any extra field)."""
    message = event.get("event")
    if isinstance(message, str) and event.get("logger") in FIRST_LINE_ONLY:
        event["event"] = message.split("\n", 1)[0]
    for name, value in event.items():
        if not isinstance(value, str) or name in ("timestamp", "level", "logger"):
            continue
        event[name] = URL_PATTERN.sub(URL_REDACTED, value) if name in REQUEST_KEYS else scrub(value)
    return event


def describe_exception(exc_info: ExcInfo) -> dict[str, Any]:
    """Type names of the exception and its causes, and where it was raised; never the messages."""
    _, error, tb = exc_info
    chain: list[str] = []
    current: BaseException | None = error
    while current is not None and len(chain) < 5:
        chain.append(f"{type(current).__module__}.{type(current).__qualname__}")
        current = current.__cause__ or current.__context__
    frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_tb(tb)[-8:]]
    return {"types": chain, "frames": frames}


def safe_exception(_logger: Any, _method: str, event: EventDict) -> EventDict:
    exc_info = event.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if isinstance(exc_info, tuple) and exc_info[0] is not None:
        event["exception"] = describe_exception(exc_info)
    return event


def configure_logging(level: str = "INFO") -> None:
    shared: list[Any] = [
        add_request_ids,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
        redact_sensitive,
        safe_exception,
        scrub_messages,
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name, quiet_level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
