"""The FCM channel's test builders: an FcmProvider for a local FCM (fakes/fake_fcm.py), and the
hint and device a test sends it."""

from __future__ import annotations

from typing import Any

from app.core.config import Settings
from app.delivery.credentials import fcm_credentials
from app.delivery.providers.fcm import FcmProvider
from app.fanout.hints import Hint
from app.recipients.types import Target
from fakes import keys
from fakes.fake_fcm import FakeFcm
from tests.support import make_settings

NO_DATABASE = "sqlite+aiosqlite:///unused.db"
TOPIC = b"\x01" + bytes(range(32))  # a welcome topic
SEQUENCE_ID = 9_007_199_254_740_993  # not exact as a double: must travel as text
FCM_CHANNEL = 2


def fcm_settings(fake: FakeFcm, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "fcm_service_account": keys.service_account(token_uri=fake.token_uri),
        "fcm_endpoint": fake.endpoint,
    }
    values.update(overrides)
    return make_settings(NO_DATABASE, **values)


def new_provider(fake: FakeFcm, timeout: float = 5.0, **overrides: Any) -> FcmProvider:
    credentials = fcm_credentials(fcm_settings(fake, **overrides))
    assert credentials is not None
    return FcmProvider(credentials, timeout_seconds=timeout)


def hint(sequence_id: int = SEQUENCE_ID) -> Hint:
    return Hint(TOPIC, sequence_id, b"\x01" * 32)


def device(token: str) -> Target:
    return Target(FCM_CHANNEL, token, None, b"\x02" * 32)
