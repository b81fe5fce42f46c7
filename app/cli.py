"""The `xmtp-push` console script."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from app.core.config import Settings, SettingsError, load_settings

COMMANDS = {
    "dev": "everything in one process on embedded defaults (SQLite, in-process queue); migrates first",
    "api": "HTTP API (Connect, health, metrics) and gRPC API",
    "migrate": "apply database migrations (alembic upgrade head)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmtp-push", description="Push notification backend for XMTP.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        commands.add_parser(name, help=help_text, description=help_text)
    return parser


def _migrate(settings: Settings) -> None:
    from app.core.migrations import upgrade

    upgrade(settings)


def _api(settings: Settings) -> None:
    from app.server import serve_api

    asyncio.run(serve_api(settings))


def _dev(settings: Settings) -> None:
    _migrate(settings)
    _api(settings)


RUNNERS = {"dev": _dev, "api": _api, "migrate": _migrate}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings()
    except SettingsError as error:
        print(f"xmtp-push: {error}", file=sys.stderr)
        return 2
    RUNNERS[args.command](settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
