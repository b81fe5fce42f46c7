"""The README's configuration table names every setting."""

from __future__ import annotations

from pathlib import Path

from app.core.config import ENV_PREFIX, Settings

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_setting_is_documented() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [
        f"{ENV_PREFIX}{name.upper()}"
        for name in Settings.model_fields
        if f"`{ENV_PREFIX}{name.upper()}`" not in text
    ]
    assert not missing, f"README.md's configuration table lacks {missing}"
