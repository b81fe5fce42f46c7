"""The rules of registration and subscription, in the admission table's order.

Each function runs inside the caller's transaction and only flushes; a raised
DomainError means the caller rolls back, so a refused request changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import errors, metrics
from app.core.config import Settings
from app.core.errors import Code, DomainError
from app.core.growth import UNLIMITED, Growth
from app.delivery.registry import FLAT_CHANNELS
from app.delivery.url_policy import UrlNotAllowed, UrlPolicy, check_webhook_url
from app.recipients import repository as repo
from app.recipients import validation
from app.recipients.models import Recipient
from app.recipients.types import (
    XMTP_CHANNELS,
    Delivery,
    RecipientState,
    RegisterCommand,
    UnregisterCommand,
    UpdateSubscriptionsCommand,
    WireChannel,
)

Clock = Callable[[], int]
SWEEP_BATCH = 500
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecipientRules:
    """What the service needs of the configuration, built once at start-up."""

    ttl_ns: int
    max_push_topics: int
    configured_channels: frozenset[WireChannel]
    url_policy: UrlPolicy
    clock: Clock = time.time_ns
    # The unconfigured channels the operator has been told about: once each per process.
    told_unconfigured: set[WireChannel] = field(default_factory=set, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> RecipientRules:
        return cls(
            ttl_ns=settings.recipient_ttl_seconds * 1_000_000_000,
            max_push_topics=settings.max_push_topics,
            configured_channels=frozenset(
                wire for wire in XMTP_CHANNELS if FLAT_CHANNELS[wire.channel].configured(settings)
            ),
            url_policy=UrlPolicy.from_settings(settings),
        )


def channel_not_configured(rules: RecipientRules, channel: WireChannel) -> DomainError:
    # The caller's answer is the contract's constant message; which settings a deployment lacks is
    # the operator's business, said once per channel in the log.
    if channel not in rules.told_unconfigured:
        rules.told_unconfigured.add(channel)
        log.warning(
            "Register asked for channel %s, which is not configured: it needs %s",
            channel.channel,
            FLAT_CHANNELS[channel.channel].configured_by,
        )
    return DomainError(Code.FAILED_PRECONDITION, errors.CHANNEL_NOT_CONFIGURED)


def hash_secret(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


async def register(
    session: AsyncSession, rules: RecipientRules, command: RegisterCommand, growth: Growth = UNLIMITED
) -> RecipientState:
    validation.check_credentials(command.recipient_id, command.recipient_secret)
    secret_hash = hash_secret(command.recipient_secret)
    # Check 3 (the secret) is decided by the upsert itself, which writes only
    # under the stored secret hash. The recipient is read only when a later
    # check refuses the request, so that a wrong secret still answers first;
    # reading it on every call cost as much as the rest of the call.
    try:
        delivery = await _admit_delivery(rules, command)
    except DomainError:
        _check_secret(await repo.get_recipient(session, command.recipient_id), secret_hash)
        raise
    now_ns = rules.clock()
    upserted = await repo.upsert_recipient(session, command.recipient_id, secret_hash, delivery, now_ns)
    if upserted is None:  # the id is taken under another secret
        raise DomainError(Code.PERMISSION_DENIED, errors.BAD_SECRET)
    if upserted.created:
        await growth.created(1)  # may refuse: the caller rolls the insert back
    metrics.recipients_total.labels("registered").inc()
    return RecipientState(upserted.topic_count, delivery.channel, now_ns + rules.ttl_ns)


async def _admit_delivery(rules: RecipientRules, command: RegisterCommand) -> Delivery:
    """Checks 4 to 7 of a registration, in order."""
    delivery = command.delivery
    if delivery is not None and delivery.channel not in rules.configured_channels:
        raise channel_not_configured(rules, delivery.channel)
    if delivery is not None and delivery.channel is WireChannel.HTTP:
        await _check_url(delivery.target, rules.url_policy)
        validation.check_signing_key(delivery)
    return validation.check_target_and_metadata(delivery, command.metadata)


async def unregister(session: AsyncSession, command: UnregisterCommand) -> None:
    validation.check_credentials(command.recipient_id, command.recipient_secret)
    recipient = await repo.get_recipient(session, command.recipient_id, lock=True)
    _require_recipient(recipient, hash_secret(command.recipient_secret))
    await repo.delete_recipient(session, command.recipient_id)
    metrics.recipients_total.labels("unregistered").inc()


async def update_subscriptions(
    session: AsyncSession, rules: RecipientRules, command: UpdateSubscriptionsCommand
) -> RecipientState:
    validation.check_credentials(command.recipient_id, command.recipient_secret)
    recipient = await repo.get_recipient(session, command.recipient_id, lock=True)
    recipient = _require_recipient(recipient, hash_secret(command.recipient_secret))
    validation.check_subscriptions(command)
    now_ns = rules.clock()
    # Applied first and counted by the statements themselves; over the limit the
    # caller rolls the whole transaction back, so nothing is applied.
    added = await repo.upsert_subscriptions(session, recipient.id, command.adds, now_ns)
    removed = await repo.delete_subscriptions(session, recipient.id, command.removes)
    topic_count = recipient.topic_count + added - removed
    if topic_count > rules.max_push_topics:
        raise DomainError(Code.RESOURCE_EXHAUSTED, errors.TOPIC_LIMIT)
    await repo.renew(session, recipient.id, topic_count, now_ns)
    metrics.subscriptions_total.labels("added").inc(added)
    metrics.subscriptions_total.labels("removed").inc(removed)
    return RecipientState(topic_count, WireChannel(recipient.channel), now_ns + rules.ttl_ns)


async def sweep_expired(session: AsyncSession, rules: RecipientRules) -> int:
    """Delete one batch of recipients past their TTL; returns how many."""
    deleted = await repo.delete_expired(session, rules.clock() - rules.ttl_ns, SWEEP_BATCH)
    metrics.recipients_total.labels("expired").inc(deleted)
    return deleted


def _check_secret(recipient: Recipient | None, secret_hash: bytes) -> None:
    """Check 3 for a known recipient: SHA-256 of the secret matches, in constant time."""
    if recipient is not None and not hmac.compare_digest(recipient.secret_hash, secret_hash):
        raise DomainError(Code.PERMISSION_DENIED, errors.BAD_SECRET)


def _require_recipient(recipient: Recipient | None, secret_hash: bytes) -> Recipient:
    """Checks 2 and 3."""
    if recipient is None:
        raise DomainError(Code.NOT_FOUND, errors.NOT_REGISTERED)
    _check_secret(recipient, secret_hash)
    return recipient


async def _check_url(url: str, policy: UrlPolicy) -> None:
    try:
        await check_webhook_url(url, policy)
    except UrlNotAllowed:
        raise DomainError(Code.INVALID_ARGUMENT, errors.URL_NOT_ALLOWED) from None
