"""`xmtp-push send-test`: one test hint to one recipient through its own channel."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from app.core.apps import DEFAULT_APP
from app.core.channels import Channel
from app.delivery.registry import log_outcome
from app.delivery.types import Outcome
from app.fanout.hints import RENDERERS, Hint
from app.recipients import repository
from app.recipients.types import Target, WireChannel
from app.runtime import Runtime

# A group-message topic no real group has: receivers can tell a test hint apart.
TEST_TOPIC = b"\x00" + b"\x00" * 16
TEST_SEQUENCE_ID = 0


class RecipientNotFound(Exception):
    pass


class ChannelNotConfigured(Exception):
    pass


@dataclass(frozen=True, slots=True)
class TestResult:
    channel: Channel
    outcome: Outcome
    seconds: float


async def send_test(
    runtime: Runtime, recipient_id: bytes, topic: bytes = TEST_TOPIC, progress: Callable[[str], None] = print
) -> TestResult:
    """Send through the recipient's channel and report the outcome; changes nothing stored."""
    progress("looking up the recipient")
    async with runtime.sessions() as session:
        recipient = await repository.get_recipient(session, recipient_id)
    if recipient is None:
        raise RecipientNotFound
    channel = WireChannel(recipient.channel).channel
    provider = runtime.providers.get(channel, DEFAULT_APP)
    if provider is None:
        raise ChannelNotConfigured(channel)
    progress(f"sending a test hint over {channel}")
    target = Target(channel, recipient.target, recipient.signing_key, recipient.secret_hash)
    push = RENDERERS[channel](Hint(topic, TEST_SEQUENCE_ID, recipient_id), target)
    started = time.perf_counter()
    outcome = await provider.send(push)
    seconds = time.perf_counter() - started
    log_outcome(channel, outcome, seconds)
    return TestResult(channel, outcome, seconds)
