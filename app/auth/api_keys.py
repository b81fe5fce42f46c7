"""API keys: the token's SHA-256 compared with every key's, in constant time, never stopping at a
match, so that the time taken tells nothing of which key matched or how much of one."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from app.core.auth_settings import ApiKey


class ApiKeys:
    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._digests = tuple((key.name, hashlib.sha256(key.value).digest()) for key in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def match(self, token: bytes) -> str | None:
        """The name of the key whose value is `token`, or None."""
        digest = hashlib.sha256(token).digest()
        found = None
        for name, expected in self._digests:
            equal = hmac.compare_digest(digest, expected)
            found = name if equal else found
        return found
