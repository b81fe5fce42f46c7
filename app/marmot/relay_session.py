"""One connection to one relay, without the socket: what to send on connect and how to answer each
message the relay sends (NIP-01 messages, NIP-42 AUTH, the kind 10050 inbox list of NIP-17).

The worker (workers/marmot_server.py) owns the websocket and feeds every text frame to `RelaySession.receive`;
the session answers what to send back, a gift wrap to handle or one that arrived as stored backlog,
and whether the connection is subscribed or should be given up and reopened.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.marmot.events import sign_event
from app.marmot.keys import ServerKey

GIFT_WRAP_KIND = 1059
INBOX_RELAYS_KIND = 10050
AUTH_KIND = 22242
# Gift wraps carry a created_at up to two days in the past (NIP-59), so the filter reaches that far back.
BACKDATE_SECONDS = 172_800
AUTH_REQUIRED = "auth-required:"


def relay_host(url: str) -> str:
    """How logs name a relay: its host, with the port when the URL gives one; never the path, the
    query or credentials (they may hold a token)."""
    parsed = urlsplit(url)
    host = parsed.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parsed.port}" if parsed.port else host


def relay_names(urls: Sequence[str]) -> list[str]:
    """Each relay's name in logs (`relay_host`), with its position in the list after any name two
    relays share (`relay.example #2`): relays on one host differ only in what is not logged."""
    hosts = [relay_host(url) for url in urls]
    shared = {host for host, count in Counter(hosts).items() if count > 1}
    return [f"{host} #{number}" if host in shared else host for number, host in enumerate(hosts, 1)]


# The machine-readable prefixes of a relay's refusal (NIP-01): all that is said of it, since the rest of
# the relay's words may carry ids.
REFUSALS = frozenset(
    {"duplicate", "pow", "blocked", "rate-limited", "invalid", "restricted", "mute", "error", "auth-required"}
)


@dataclass(frozen=True, slots=True)
class Published:
    """A relay's answer to an event we published: accepted or not, and its refusal's prefix."""

    accepted: bool
    reason: str = ""  # one of REFUSALS, or "" (accepted, or no prefix given)


def ok_answer(text: str, event_id: str) -> Published | None:
    """The relay's `["OK", event_id, accepted, message]` for our event; None for any other frame."""
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, list) or len(message) < 3 or message[:2] != ["OK", event_id]:
        return None
    words = message[3] if len(message) > 3 and isinstance(message[3], str) else ""
    prefix = words.split(":", 1)[0].strip() if ":" in words else ""
    return Published(message[2] is True, prefix if prefix in REFUSALS else "")


def event_of_frame(text: str) -> dict[str, Any] | None:
    """The event of a relay's `["EVENT", subscription, event]` frame (as the shared wrap queue carries
    it); None for anything else."""
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(message, list) and len(message) == 3 and isinstance(message[2], dict):
        return message[2]
    return None


def subscription_filter(pubkey_hex: str, now: int) -> dict[str, Any]:
    """Gift wraps to us from now on: `limit` 0 asks for no stored events (some relays send them anyway)."""
    return {"kinds": [GIFT_WRAP_KIND], "#p": [pubkey_hex], "since": now - BACKDATE_SECONDS, "limit": 0}


def inbox_relays_event(key: ServerKey, relays: Sequence[str], now: int) -> dict[str, Any]:
    """The signed kind 10050 list of the relays where senders deliver our gift wraps."""
    return sign_event(key.secret, INBOX_RELAYS_KIND, [["relay", url] for url in relays], "", now)


def auth_event(key: ServerKey, relay_url: str, challenge: str, now: int) -> dict[str, Any]:
    """The signed kind 22242 answer to a relay's NIP-42 challenge."""
    return sign_event(key.secret, AUTH_KIND, [["relay", relay_url], ["challenge", challenge]], "", now)


def _dumps(message: list[Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


@dataclass(slots=True)
class Reaction:
    """What one relay message asks of the connection."""

    send: list[str] = field(default_factory=list)  # text frames to send, in order
    trigger: dict[str, Any] | None = None  # a live gift wrap to handle
    backlog: bool = False  # a stored gift wrap (before EOSE): counted, not handled
    notice: str | None = None  # something to log (never the relay's own words: they may carry ids)
    reconnect: bool = False  # give this connection up and open a new one after a backoff


NOTHING = Reaction()


class RelaySession:
    """The state of one connection: its subscription id, whether EOSE came, and NIP-42 progress."""

    def __init__(
        self,
        url: str,
        key: ServerKey,
        relays: Sequence[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url, self._key, self._relays, self._clock = url, key, tuple(relays), clock
        self.subscription_id = ""
        self.live = False  # EOSE came for the current subscription
        self.authenticated = False
        self._auth_event_id: str | None = None
        self._inbox_event_id: str | None = None
        self._waiting_auth = False  # the subscription was CLOSED auth-required: again once accepted
        self._inbox_waiting_auth = False

    def opening(self) -> list[str]:
        """The frames sent right after connecting: our inbox relay list, then the subscription."""
        return [self._inbox_message(), self._subscribe()]

    def receive(self, text: str) -> Reaction:
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: a nesting bomb
            return NOTHING
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            return NOTHING
        handler = self._HANDLERS.get(message[0])
        return handler(self, message[1:]) if handler is not None else NOTHING

    # ---- messages from the relay

    def _on_event(self, body: list[Any]) -> Reaction:
        if len(body) != 2 or body[0] != self.subscription_id or not isinstance(body[1], dict):
            return NOTHING
        if not self.live:
            return Reaction(backlog=True)
        return Reaction(trigger=body[1])

    def _on_eose(self, body: list[Any]) -> Reaction:
        if body and body[0] == self.subscription_id:
            self.live = True
        return NOTHING

    def _on_closed(self, body: list[Any]) -> Reaction:
        if not body or body[0] != self.subscription_id:
            return NOTHING
        self.live = False
        reason = body[1] if len(body) > 1 and isinstance(body[1], str) else ""
        if reason.startswith(AUTH_REQUIRED) and not self.authenticated:
            self._waiting_auth = True
            return Reaction(notice="subscription closed until we authenticate")
        return Reaction(notice="subscription closed by the relay", reconnect=True)

    def _on_auth(self, body: list[Any]) -> Reaction:
        if not body or not isinstance(body[0], str):
            return NOTHING
        event = auth_event(self._key, self.url, body[0], int(self._clock()))
        self._auth_event_id = event["id"]
        return Reaction(send=[_dumps(["AUTH", event])])

    def _on_ok(self, body: list[Any]) -> Reaction:
        if len(body) < 2 or not isinstance(body[0], str):
            return NOTHING
        accepted = body[1] is True
        reason = body[2] if len(body) > 2 and isinstance(body[2], str) else ""
        if body[0] == self._auth_event_id:
            return self._on_auth_answer(accepted)
        if body[0] == self._inbox_event_id and not accepted:
            if reason.startswith(AUTH_REQUIRED) and not self.authenticated:
                self._inbox_waiting_auth = True
                return NOTHING
            return Reaction(notice="the relay refused our inbox relay list")
        return NOTHING

    def _on_auth_answer(self, accepted: bool) -> Reaction:
        if not accepted:
            return Reaction(notice="the relay refused our authentication")
        self.authenticated = True
        send = []
        if self._inbox_waiting_auth:
            self._inbox_waiting_auth = False
            send.append(self._inbox_message())
        if self._waiting_auth:
            self._waiting_auth = False
            send.append(self._subscribe())
        return Reaction(send=send, notice="authenticated")

    def _on_notice(self, body: list[Any]) -> Reaction:
        return Reaction(notice="the relay sent a notice")

    _HANDLERS: dict[str, Callable[[RelaySession, list[Any]], Reaction]] = {
        "EVENT": _on_event,
        "EOSE": _on_eose,
        "CLOSED": _on_closed,
        "AUTH": _on_auth,
        "OK": _on_ok,
        "NOTICE": _on_notice,
    }

    # ---- messages to the relay

    def _subscribe(self) -> str:
        """A fresh subscription id every time, so nothing of an earlier one is taken for this one."""
        self.subscription_id = secrets.token_hex(8)
        self.live = False
        now = int(self._clock())
        return _dumps(["REQ", self.subscription_id, subscription_filter(self._key.public_hex, now)])

    def _inbox_message(self) -> str:
        event = inbox_relays_event(self._key, self._relays, int(self._clock()))
        self._inbox_event_id = event["id"]
        return _dumps(["EVENT", event])
