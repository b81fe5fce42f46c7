"""The keys a JWT may be checked against, and the choice of one before any signature is checked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.auth_settings import InlineKey, PublicKey


@dataclass(frozen=True, slots=True)
class VerificationKey:
    kid: str | None
    alg: str
    public_key: PublicKey = field(repr=False)


@dataclass(frozen=True, slots=True)
class KeySet:
    keys: tuple[VerificationKey, ...] = ()

    @classmethod
    def inline(cls, keys: Sequence[InlineKey]) -> KeySet:
        return cls(tuple(VerificationKey(key.kid, key.alg, key.public_key) for key in keys))

    def __len__(self) -> int:
        return len(self.keys)

    def choose(self, kid: str | None, alg: str) -> VerificationKey | None:
        """With a `kid`, the one key of that kid; without, the one key of the token's `alg`. None when
        there is none, or several, or the chosen key is for another algorithm: never a second try."""
        if kid is not None:
            found = [key for key in self.keys if key.kid == kid]
        else:
            found = [key for key in self.keys if key.alg == alg]
        if len(found) != 1 or found[0].alg != alg:
            return None
        return found[0]
