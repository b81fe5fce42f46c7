"""A ceiling on what the database may grow by: the services tell it of each recipient or installation
they create, inside the call's transaction, and it may refuse (a DomainError), which rolls the call
back whole. The API's quotas implement it (XMTP_PUSH_NEW_RECIPIENTS_PER_MINUTE, app.quotas)."""

from __future__ import annotations

from typing import Protocol


class Growth(Protocol):
    async def created(self, count: int) -> None:
        """`count` rows were created; raises a DomainError when that is over the ceiling."""


class _Unlimited:
    async def created(self, count: int) -> None:
        return None


UNLIMITED: Growth = _Unlimited()
