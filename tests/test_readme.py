"""The configuration table of docs/configuration.md names every setting."""

from __future__ import annotations

from pathlib import Path

from app.core.config import ENV_PREFIX, UNPREFIXED_SETTINGS, Settings

CONFIGURATION_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_every_setting_is_documented() -> None:
    text = CONFIGURATION_PAGE.read_text(encoding="utf-8")
    variables = [
        UNPREFIXED_SETTINGS.get(name, f"{ENV_PREFIX}{name.upper()}") for name in Settings.model_fields
    ]
    missing = [variable for variable in variables if f"`{variable}`" not in text]
    assert not missing, f"docs/configuration.md's table lacks {missing}"
