"""The legacy source's delivery jobs for the one delivery loop (workers/delivery_worker.py): one push
to one installation, rendered for its channel as docs/legacy.md#payloads-channel-by-channel says,
with the installation's current token looked up at each attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from prometheus_client.metrics import Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core import metrics
from app.core.channels import Channel
from app.core.config import Settings
from app.core.legacy_settings import signing_key_bytes
from app.delivery.registry import ChannelApp
from app.delivery.types import OutcomeKind, Push
from app.legacy import repository as repo
from app.legacy.commands import MechanismKind
from app.legacy.fanout import ChannelOf
from app.legacy.jobs import LegacyDeliveryJob, legacy_delivery_stream
from app.legacy.messages import parse
from app.legacy.payloads import (
    EPOCH,
    HTTP_DELIVERY_APP,
    LegacyDelivery,
    PayloadSettings,
    http_delivery_config,
    render,
)
from app.legacy.repository import LegacyTarget
from app.legacy.service import LegacyRules

MECHANISM_LABELS = {int(kind): kind.label for kind in MechanismKind}


def payload_settings(settings: Settings) -> PayloadSettings:
    authorization = settings.legacy_http_delivery_authorization
    signing_key = settings.legacy_http_delivery_signing_key
    return PayloadSettings(
        alert_text=settings.legacy_alert_text,
        bundle_id=settings.apns_bundle_id,
        http_url=settings.legacy_http_delivery_url,
        http_authorization=authorization.get_secret_value() if authorization else None,
        http_signing_key=signing_key_bytes(signing_key.get_secret_value()) if signing_key else None,
    )


def legacy_apps(settings: Settings) -> list[ChannelApp]:
    """The apps of the legacy source's own: the operator's HTTP delivery, when it is configured (its
    APNs and FCM pushes go through those channels' default apps)."""
    if not (settings.legacy_api_enabled and settings.legacy_http_delivery_url):
        return []
    config = http_delivery_config(settings.webhook_max_per_host)
    return [ChannelApp(Channel.HTTP, HTTP_DELIVERY_APP, config)]


class LegacyDeliveries:
    """Jobs on `legacy.deliveries.<channel>`, for installations."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        reads: async_sessionmaker[AsyncSession],
        rules: LegacyRules,
        channel_of: ChannelOf,
        payloads: PayloadSettings,
    ) -> None:
        self.sessions, self.reads, self.rules = sessions, reads, rules
        self.channel_of_kind = channel_of
        self.payloads = payloads

    def stream(self, channel: Channel) -> str:
        return legacy_delivery_stream(channel)

    def decode(self, payload: bytes) -> LegacyDeliveryJob:
        return LegacyDeliveryJob.decode(payload)

    def key(self, job: LegacyDeliveryJob) -> str:
        return job.installation_id

    async def targets(self, keys: Sequence[str]) -> Mapping[str, LegacyTarget]:
        async with self.reads() as session:
            return await repo.targets(session, keys, self.rules.alive_since(self.rules.clock()))

    def channel_of(self, target: LegacyTarget) -> Channel | None:
        return self.channel_of_kind(target.kind)

    def render(self, channel: Channel, job: LegacyDeliveryJob, target: LegacyTarget) -> Push:
        # Only the HTTP delivery's body tells the subscription's creation and `should_push`: the
        # message is read again, and the time converted, for that channel alone.
        http = channel is Channel.HTTP
        delivery = LegacyDelivery(
            job.topic,
            job.message,
            job.timestamp_ns,
            job.idempotency_key,
            job.installation_id,
            MECHANISM_LABELS[target.kind],
            target.token,
            job.is_silent,
            datetime.fromtimestamp(job.created_ns / 1e9, UTC) if http else EPOCH,
            parse(job.topic, job.message).should_push if http else None,
        )
        return render(channel, delivery, self.payloads)

    def rank(self, job: LegacyDeliveryJob) -> int:
        return job.timestamp_ns

    async def forget_if_unchanged(self, key: str, target: LegacyTarget) -> bool:
        async with self.sessions() as session, session.begin():
            return await repo.forget_token_if_unchanged(session, key, target)

    def outcome_counter(self, channel: Channel, kind: OutcomeKind) -> Counter:
        return metrics.legacy_deliveries_total.labels(channel, kind.value)

    def count_dead(self) -> None:
        metrics.legacy_installations_total.labels("dead").inc()
