"""Building a Marmot trigger's gift wrap (NIP-59): what a sending app does, here for tools, tests and
the benchmark's bare loop. Each layer is built on its own so a test can spoil exactly one."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from app.marmot import nip44, secp
from app.marmot.events import sign_event, unsigned_event
from app.marmot.tokens import Platform, encrypt_token
from app.marmot.unwrap import SEAL_KIND, TRIGGER_KIND, TRIGGER_TAGS, WRAP_KIND


def _json(event: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(event), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def trigger_rumor(
    sender_secret: bytes,
    content: bytes,
    *,
    created_at: int | None = None,
    kind: int = TRIGGER_KIND,
    tags: Sequence[Sequence[str]] = TRIGGER_TAGS,
    encoded: str | None = None,
) -> dict[str, Any]:
    """The unsigned kind 446 rumor carrying `content` (base64, unless `encoded` is given as is)."""
    text = base64.b64encode(content).decode("ascii") if encoded is None else encoded
    pubkey = secp.xonly_public_key(sender_secret).hex()
    return unsigned_event(pubkey, kind, tags, text, int(time.time()) if created_at is None else created_at)


def seal(
    rumor: Mapping[str, Any],
    sender_secret: bytes,
    server_public_x: bytes,
    *,
    created_at: int | None = None,
    tags: Sequence[Sequence[str]] = (),
) -> dict[str, Any]:
    """The kind 13 seal: the rumor NIP-44-encrypted from the sender to the server, signed by the sender."""
    content = nip44.encrypt(_json(rumor), nip44.conversation_key(sender_secret, server_public_x))
    return sign_event(
        sender_secret, SEAL_KIND, tags, content, int(time.time()) if created_at is None else created_at
    )


def gift_wrap(
    sealed: Mapping[str, Any],
    server_public_x: bytes,
    *,
    created_at: int | None = None,
    wrapper_secret: bytes | None = None,
) -> dict[str, Any]:
    """The kind 1059 wrap: the seal NIP-44-encrypted from a throwaway key to the server, p-tagged."""
    wrapper = secp.fresh_secret() if wrapper_secret is None else wrapper_secret
    content = nip44.encrypt(_json(sealed), nip44.conversation_key(wrapper, server_public_x))
    tags = [["p", server_public_x.hex()]]
    return sign_event(
        wrapper, WRAP_KIND, tags, content, int(time.time()) if created_at is None else created_at
    )


def wrap_trigger(
    content: bytes, server_public_x: bytes, *, sender_secret: bytes | None = None
) -> dict[str, Any]:
    """A complete trigger for `content` (concatenated EncryptedTokens), from a fresh sender key
    unless one is given."""
    sender = secp.fresh_secret() if sender_secret is None else sender_secret
    return gift_wrap(seal(trigger_rumor(sender, content), sender, server_public_x), server_public_x)


def one_token_trigger(server_public_x: bytes, platform: Platform, token: str) -> dict[str, Any]:
    """What an app sends to wake one device (`xmtp-push marmot send-test`): the device's token encrypted
    to the server, gift-wrapped to it from fresh keys. TokenError for a token of no valid form."""
    return wrap_trigger(encrypt_token(server_public_x, platform, token), server_public_x)
