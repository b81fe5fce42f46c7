"""A channel is complete: a descriptor with every part, its provider's outcome table, a fake of its
remote end, and (for a channel XMTP recipients may choose) its default app's settings and the XMTP
source's rendering."""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from app.core.channels import Channel
from app.core.config import ENV_PREFIX, Settings
from app.delivery.registry import CHANNELS, FLAT_CHANNELS
from app.delivery.types import Outcome
from app.fanout.hints import RENDERERS
from app.recipients.types import XMTP_CHANNELS, WireChannel

CONFIGURATION_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
# The fake of each channel's remote end, which its tests and the benchmarks send to.
FAKES = {
    Channel.APNS: "fakes.fake_apns",
    Channel.FCM: "fakes.fake_fcm",
    Channel.HTTP: "fakes.webhook_receiver",
    Channel.WEBPUSH: "fakes.fake_webpush",
}
OPTIONAL = {"default_app", "max_payload_bytes"}  # None: only a source's own apps use it; its provider decides


@pytest.mark.parametrize("channel", list(Channel))
def test_every_channel_has_a_descriptor_with_every_part(channel: Channel) -> None:
    descriptor = CHANNELS[channel]
    for field in fields(descriptor):
        if field.name not in OPTIONAL:
            assert getattr(descriptor, field.name), f"{channel}: {field.name} is not set"
    assert isinstance(descriptor.credentials, type)
    assert re.fullmatch(r"#[0-9a-f]{6}", descriptor.color), descriptor.color


def test_labels_and_colors_tell_the_channels_apart() -> None:
    assert len({d.label for d in CHANNELS.values()}) == len(Channel)
    assert len({d.color for d in CHANNELS.values()}) == len(Channel)


@pytest.mark.parametrize("channel", list(Channel))
def test_every_provider_answers_from_an_outcome_table_in_its_module(channel: Channel) -> None:
    module = sys.modules[CHANNELS[channel].provider.__module__]
    tables = [value for name, value in vars(module).items() if name.endswith("OUTCOMES")]
    outcomes = [
        o
        for table in tables
        for o in (table.values() if isinstance(table, dict) else (pair[1] for pair in table))
    ]
    assert outcomes, f"{module.__name__} has no outcome table"
    assert all(isinstance(outcome, Outcome) for outcome in outcomes)


def test_every_channel_has_a_fake_of_its_remote_end() -> None:
    assert set(FAKES) == set(Channel)
    for module in FAKES.values():
        importlib.import_module(module)


@pytest.mark.parametrize("wire", XMTP_CHANNELS)
def test_a_channel_xmtp_recipients_may_choose_has_a_default_app_and_a_rendering(wire: WireChannel) -> None:
    channel = wire.channel
    assert channel in FLAT_CHANNELS, f"{channel}: no default app from the flat settings"
    assert channel in RENDERERS, f"{channel}: the XMTP source does not render it"


@pytest.mark.parametrize("channel", list(FLAT_CHANNELS))
def test_a_default_apps_settings_are_settings_and_documented(channel: Channel) -> None:
    default = FLAT_CHANNELS[channel]
    page = CONFIGURATION_PAGE.read_text()
    assert set(default.required) <= set(default.settings)
    for name in default.settings:
        assert name in Settings.model_fields, name
        assert f"| `{ENV_PREFIX}{name.upper()}` |" in page, name
    assert default.configured_by.startswith(ENV_PREFIX)
