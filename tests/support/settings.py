"""What the settings' tests share: an environment holding none of the outer one's settings, and a
XMTP_PUSH_CONFIG file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.config import ENV_PREFIX


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No XMTP_PUSH_* variable from the outer environment leaks into a test (autouse where imported)."""
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX) or name.upper() in ("HTTPS_PROXY", "NO_PROXY"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def write_config(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "xmtp-push.toml"
    path.write_text(text)
    monkeypatch.setenv("XMTP_PUSH_CONFIG", str(path))
    return path
