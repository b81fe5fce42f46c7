"""Apply the Alembic revisions under the top-level alembic/ folder."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.core.config import Settings

_CANDIDATES = (Path(__file__).resolve().parents[2] / "alembic", Path.cwd() / "alembic")


def alembic_config(database_url: str) -> Config:
    location = next((path for path in _CANDIDATES if (path / "env.py").is_file()), None)
    if location is None:
        raise FileNotFoundError("alembic/ folder with env.py not found")
    config = Config()
    config.set_main_option("script_location", str(location))
    config.set_main_option("path_separator", "os")
    config.attributes["database_url"] = database_url
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Bring the configured database to `revision`. Blocking: run outside the event loop."""
    command.upgrade(alembic_config(settings.database_url), revision)
