"""Whether a push provider keeps failing, judged from the Marmot server's own recent pushes: /readyz
answers 503 while one does, so that an orchestrator does not count on a process that cannot push, and
200 again once its pushes succeed (nothing is probed: with no pushes, the last verdict stands).

A push counts against its provider only for the provider's own reasons: an error or no answer (5xx,
a timeout, a refused connection) or its credentials refused. A dead or foreign token, or a push refused
for what it carries, counts for it: the provider answered. Anyone can send triggers holding tokens of
their choosing, so no token may turn a process unready.
"""

from __future__ import annotations

import logging
from collections import deque

from app.core.channels import Channel
from app.delivery.types import Outcome, OutcomeKind

log = logging.getLogger("app.marmot.push_health")

# The recent pushes judged, per channel; fewer than MIN_PUSHES of them say nothing yet.
WINDOW = 10
MIN_PUSHES = 5


def provider_failed(outcome: Outcome) -> bool:
    """Whether the push failed for the provider's reasons, not the token's."""
    return outcome.kind is OutcomeKind.FAILED or outcome.credentials_refused


class PushHealth:
    """The recent outcomes of each channel's pushes; a channel keeps failing while more than half of
    them (at least MIN_PUSHES judged) failed for its provider's reasons."""

    def __init__(self) -> None:
        self._recent: dict[Channel, deque[bool]] = {}
        self._failing: set[Channel] = set()

    def note(self, channel: Channel, outcome: Outcome) -> None:
        if outcome.kind is OutcomeKind.DEFERRED:  # not attempted: says nothing of the provider
            return
        recent = self._recent.setdefault(channel, deque(maxlen=WINDOW))
        recent.append(provider_failed(outcome))
        failed = sum(recent)
        failing = len(recent) >= MIN_PUSHES and 2 * failed > len(recent)
        if failing == (channel in self._failing):
            return
        if failing:
            self._failing.add(channel)
            log.warning(
                "Marmot: %s pushes keep failing (%d of the last %d, for reasons not the token's); "
                "/readyz answers 503 until they succeed again",
                channel.value,
                failed,
                len(recent),
            )
        else:
            self._failing.discard(channel)
            log.info("Marmot: %s pushes succeed again", channel.value)

    def delivering(self) -> bool:
        """No channel keeps failing."""
        return not self._failing
