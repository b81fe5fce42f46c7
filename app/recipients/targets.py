"""Recipients' delivery targets, as the delivery worker needs them: looked up, forgotten when dead.

Each call is one unit of work of the worker's job: a read on its own, or a deletion committed
on its own (the worker acknowledges its entry only after, so a crash repeats the deletion).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.recipients import repository as repo
from app.recipients.types import Target


class RecipientTargets:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], reads: async_sessionmaker[AsyncSession]
    ) -> None:
        self._sessions = sessions
        self._reads = reads

    async def targets(self, recipient_ids: Sequence[bytes]) -> dict[bytes, Target]:
        """The current target of each recipient that still exists."""
        async with self._reads() as session:
            return await repo.targets_by_id(session, recipient_ids)

    async def forget_if_unchanged(self, recipient_id: bytes, target: Target) -> bool:
        """Delete a recipient whose target is dead, unless it re-registered since; True if deleted."""
        async with self._sessions() as session, session.begin():
            return await repo.delete_if_unchanged(session, recipient_id, target)
