"""The rules of the five notifications.v1 RPCs, in the contract's order of checks
(docs/legacy.md#answers-and-errors).

Each function runs inside the caller's transaction and only flushes; a raised DomainError means the
caller rolls back, so a refused request changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import errors, metrics
from app.core.config import Settings
from app.core.errors import Code, DomainError
from app.core.growth import UNLIMITED, Growth
from app.legacy import repository as repo
from app.legacy.commands import (
    DeleteInstallation,
    Mechanism,
    MechanismKind,
    Registered,
    RegisterInstallation,
    Subscribe,
    SubscriptionSpec,
    Unsubscribe,
)

Clock = Callable[[], int]
log = logging.getLogger(__name__)
MISSING_INSTALLATION_ID = "missing installation id"
MISSING_MECHANISM = "missing delivery mechanism"
TOPIC_LIMIT = "installation topic limit reached"
MAX_INSTALLATION_ID_CHARS = 256
MAX_TOKEN_CHARS = 4096
MAX_TOPIC_CHARS = 256
MAX_KEY_BYTES = 64
HTTP_DELIVERY_SETTING = "XMTP_PUSH_LEGACY_HTTP_DELIVERY_URL"


@dataclass(frozen=True, slots=True)
class LegacyRules:
    """What the service needs of the configuration, built once at start-up."""

    ttl_ns: int
    max_push_topics: int
    # The mechanism kinds some configured channel delivers, and what each of the others needs.
    deliverable: frozenset[MechanismKind]
    needs: dict[MechanismKind, str]
    clock: Clock = time.time_ns
    told_unconfigured: set[MechanismKind] = field(default_factory=set, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> LegacyRules:
        http = bool(settings.legacy_http_delivery_url)
        own = {MechanismKind.APNS: settings.apns_configured, MechanismKind.FCM: settings.fcm_configured}
        deliverable = frozenset(kind for kind in MechanismKind if http or own.get(kind, False))
        needs = {
            MechanismKind.APNS: f"the XMTP_PUSH_APNS_* settings or {HTTP_DELIVERY_SETTING}",
            MechanismKind.FCM: f"XMTP_PUSH_FCM_SERVICE_ACCOUNT or {HTTP_DELIVERY_SETTING}",
            MechanismKind.CUSTOM: HTTP_DELIVERY_SETTING,
        }
        return cls(
            ttl_ns=settings.legacy_installation_ttl_seconds * 1_000_000_000,
            max_push_topics=settings.max_push_topics,
            deliverable=deliverable,
            needs=needs,
        )

    def alive_since(self, now_ns: int) -> int:
        """The earliest registration time of an installation that has not expired at `now_ns`."""
        return now_ns - self.ttl_ns


async def register(
    session: AsyncSession, rules: LegacyRules, command: RegisterInstallation, growth: Growth = UNLIMITED
) -> Registered:
    check_installation_id(command.installation_id)
    mechanism = command.mechanism
    if mechanism is None or not mechanism.token:
        raise DomainError(Code.INVALID_ARGUMENT, MISSING_MECHANISM)
    _check_token(mechanism)
    if mechanism.kind not in rules.deliverable:
        raise _not_configured(rules, mechanism.kind)
    now = rules.clock()
    previous = await repo.registered_ns(session, command.installation_id)
    if previous is not None and previous + rules.ttl_ns <= now:
        # Expired: it starts afresh; what was subscribed since its expiry stays.
        await repo.drop_subscriptions(session, command.installation_id, previous + rules.ttl_ns)
    await repo.upsert_installation(session, command.installation_id, mechanism, now)
    if previous is None:
        await growth.created(1)  # may refuse: the caller rolls the insert back
    await session.flush()
    metrics.legacy_installations_total.labels("registered").inc()
    return Registered(command.installation_id, (now + rules.ttl_ns) // 1_000_000)


async def delete(session: AsyncSession, command: DeleteInstallation) -> None:
    check_installation_id(command.installation_id)
    if await repo.mark_deleted(session, command.installation_id):
        metrics.legacy_installations_total.labels("deleted").inc()
    await session.flush()


async def subscribe(session: AsyncSession, rules: LegacyRules, command: Subscribe) -> None:
    check_installation_id(command.installation_id)
    # A topic repeated in one request: the last one wins (some SDKs send every subscription twice).
    specs = list({spec.topic: spec for spec in command.subscriptions}.values())
    for spec in specs:
        _check_topic(spec.topic)
        _check_keys(spec.keys.values())
    if not specs:
        return
    active, among = await repo.active_topics(session, command.installation_id, [s.topic for s in specs])
    if active + len(specs) - among > rules.max_push_topics:
        raise DomainError(Code.RESOURCE_EXHAUSTED, TOPIC_LIMIT)
    await repo.subscribe(
        session, command.installation_id, specs, rules.clock(), keep=not command.with_metadata
    )
    await session.flush()
    metrics.legacy_subscriptions_total.labels("subscribed").inc(len(specs))


async def unsubscribe(session: AsyncSession, command: Unsubscribe) -> None:
    check_installation_id(command.installation_id)
    topics = list(dict.fromkeys(command.topics))
    for topic in topics:
        _check_topic(topic)
    if not topics:
        return
    changed = await repo.unsubscribe(session, command.installation_id, topics)
    await session.flush()
    metrics.legacy_subscriptions_total.labels("unsubscribed").inc(changed)


async def sweep_expired(session: AsyncSession, rules: LegacyRules, batch: int) -> bool:
    """Delete up to `batch` expired installations and up to `batch` subscriptions no registration
    keeps; True when there may be more."""
    installations, orphans = await repo.delete_expired(session, rules.alive_since(rules.clock()), batch)
    metrics.legacy_installations_total.labels("expired").inc(installations)
    return installations == batch or orphans == batch


def topics_only(topics: Iterable[str]) -> tuple[SubscriptionSpec, ...]:
    """Subscribe's topics as subscriptions that keep their silence and keys."""
    return tuple(SubscriptionSpec(topic) for topic in topics)


def check_installation_id(installation_id: str) -> None:
    if not installation_id or len(installation_id) > MAX_INSTALLATION_ID_CHARS:
        raise DomainError(Code.INVALID_ARGUMENT, MISSING_INSTALLATION_ID)
    if "\x00" in installation_id:
        raise errors.malformed()


def _check_token(mechanism: Mechanism) -> None:
    if len(mechanism.token) > MAX_TOKEN_CHARS or "\x00" in mechanism.token:
        raise errors.malformed()


def _check_topic(topic: str) -> None:
    if len(topic) > MAX_TOPIC_CHARS or "\x00" in topic:
        raise errors.malformed()


def _check_keys(keys: Iterable[bytes]) -> None:
    if any(not key or len(key) > MAX_KEY_BYTES for key in keys):
        raise errors.malformed()


def _not_configured(rules: LegacyRules, kind: MechanismKind) -> DomainError:
    # The caller gets the constant message; what the deployment lacks is said once per kind.
    if kind not in rules.told_unconfigured:
        rules.told_unconfigured.add(kind)
        log.warning(
            "RegisterInstallation asked for channel %s, which is not configured: it needs %s",
            kind.label,
            rules.needs[kind],
        )
    return DomainError(Code.FAILED_PRECONDITION, errors.CHANNEL_NOT_CONFIGURED)
