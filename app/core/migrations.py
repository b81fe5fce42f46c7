"""Apply the Alembic revisions of the top-level alembic/ folder.

In a source tree they are read from alembic/ itself. An installed wheel carries a copy as data files
(pyproject.toml, `[tool.setuptools.data-files]`) under `<prefix>/share/xmtp-push/alembic`; the
installed distribution's own file list says where that prefix is, whatever the install scheme
(a venv, `--user`, `--prefix`, a container's system Python).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.core.config import Settings
from app.core.database import prepare_sqlite_file

DISTRIBUTION = "xmtp-push"
INSTALLED_ENV = "share/xmtp-push/alembic/env.py"
_SOURCE_TREE = Path(__file__).resolve().parents[2]


class MigrationsNotFound(Exception):
    """Neither a source tree's alembic/ nor an installed copy of it is here."""


def script_location() -> Path:
    if (_SOURCE_TREE / "pyproject.toml").is_file() and (_SOURCE_TREE / "alembic" / "env.py").is_file():
        return _SOURCE_TREE / "alembic"
    installed = _installed_location()
    if installed is None:
        raise MigrationsNotFound("the migration scripts are not installed: reinstall the xmtp-push package")
    return installed


def _installed_location() -> Path | None:
    try:
        files = metadata.distribution(DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.as_posix().endswith(INSTALLED_ENV):
            env = Path(str(file.locate())).resolve()
            return env.parent if env.is_file() else None
    return None


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.set_main_option("path_separator", "os")
    config.attributes["database_url"] = database_url
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Bring the configured database to `revision`. Blocking: run outside the event loop."""
    prepare_sqlite_file(settings.database_url)
    command.upgrade(alembic_config(settings.database_url), revision)


def head_revision(settings: Settings) -> str | None:
    """The newest revision of the installed migration scripts."""
    return ScriptDirectory.from_config(alembic_config(settings.database_url)).get_current_head()
