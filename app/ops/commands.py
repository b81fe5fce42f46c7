"""Operator commands: `send-test`, `stats`, `config check`, `legacy import`. They print; they serve
nothing.

Each command imports what it needs when it runs, so `stats` does not load the channel clients or
the migration tooling.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from app.core.config import Settings
from app.ops.roles import ROLES, SENDING_ROLES

if TYPE_CHECKING:
    from app.ops.stats import Stats


HELP = {
    "send-test": "send a test hint to one recipient through its channel and print the outcome",
    "stats": "recipients, subscriptions, queue depths and the last hour's delivery outcomes",
    "config": "configuration tools (config check)",
    "check": "validate configuration, credentials and dependencies; serve nothing",
    "legacy": "tools of the legacy notifications.v1 API (legacy import)",
    "import": (
        "add the installations, subscriptions and HMAC keys of an example-notification-server-go database "
        "(read-only) to this one; what is already here is kept"
    ),
    "healthcheck": (
        "ask the port the running command serves for /readyz (the image's health check): exit 0 when "
        "ready, 1 otherwise"
    ),
}


def add(into: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """A command whose help line in the list is also its description under `--help`."""
    parser: argparse.ArgumentParser = into.add_parser(name, help=HELP[name], description=HELP[name])
    return parser


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    send = add(commands, "send-test")
    send.add_argument("recipient_id", help="the recipient id, 64 hex digits")
    send.add_argument("--topic", help="topic bytes as hex or base64 (default: a test topic)")
    stats = add(commands, "stats")
    stats.add_argument("--json", action="store_true", help="print one JSON document")
    config_commands = add(commands, "config").add_subparsers(
        dest="config_command", required=True, metavar="COMMAND"
    )
    add(config_commands, "check").add_argument(
        "--role",
        choices=ROLES,
        help="check what this command needs and nothing else (default: the roles whose settings are present)",
    )
    legacy_commands = add(commands, "legacy").add_subparsers(
        dest="legacy_command", required=True, metavar="COMMAND"
    )
    legacy_import = add(legacy_commands, "import")
    legacy_import.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the Go server's PostgreSQL database: postgresql://user:password@host:port/database",
    )
    legacy_import.add_argument(
        "--dry-run", action="store_true", help="print what would be imported; write nothing"
    )
    health = add(commands, "healthcheck")
    health.add_argument(
        "--pid",
        type=int,
        default=1,
        help="the process whose command is checked (default 1: a container's main process)",
    )


def _bytes_argument(value: str, name: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        pass
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SystemExit(f"xmtp-push: {name} must be hex or base64") from None


def run_send_test(settings: Settings, args: argparse.Namespace) -> int:
    from app.ops.send_test import ChannelNotConfigured, RecipientNotFound, send_test
    from app.runtime import open_runtime

    recipient_id = _bytes_argument(args.recipient_id, "recipient_id")
    if len(recipient_id) != 32:
        raise SystemExit("xmtp-push: recipient_id must be 32 bytes")
    kwargs = {"topic": _bytes_argument(args.topic, "--topic")} if args.topic else {}

    async def run() -> int:
        async with open_runtime(settings) as runtime:
            try:
                result = await send_test(runtime, recipient_id, progress=_progress, **kwargs)
            except RecipientNotFound:
                print("recipient is not registered", file=sys.stderr)
                return 1
            except ChannelNotConfigured as error:
                print(f"channel {error} is not configured here", file=sys.stderr)
                return 1
        reason = f": {result.outcome.reason}" if result.outcome.reason else ""
        print(f"{result.channel}: {result.outcome.kind.value} in {result.seconds * 1000:.0f} ms{reason}")
        return 0 if result.outcome.kind.value == "delivered" else 1

    return asyncio.run(run())


def _progress(step: str) -> None:
    print(f"... {step}", file=sys.stderr, flush=True)


def run_stats(settings: Settings, args: argparse.Namespace) -> int:
    from app.ops.stats import collect_stats
    from app.runtime import open_runtime

    async def run() -> Stats:
        async with open_runtime(settings, sends=False) as runtime:
            return await collect_stats(runtime)

    stats = asyncio.run(run())
    if args.json:
        document = asdict(stats)
        document.pop("minutes")
        document.pop("series")
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(format_stats(stats))
    return 0


def format_stats(stats: Stats) -> str:
    from app.ops.stats import listener_summary, node_go_summary

    # `stats` reads strictly (a service down exits with its code): nothing here is unknown.
    lines = ["recipients:"]
    lines += [f"  {channel:<6} {count}" for channel, count in (stats.recipients or {}).items()]
    lines.append(f"subscriptions: {stats.subscriptions}")
    if stats.queue_depths is None:
        lines.append("queues: none configured (XMTP_PUSH_REDIS_URL unset)")
    else:
        lines.append("queue depths:")
        lines += [f"  {name:<18} {depth}" for name, depth in stats.queue_depths.items()]
        lines.append(f"  {'retries waiting':<18} {stats.retries_waiting}")
    lines.append("delivery outcomes, last hour:")
    if not stats.outcomes:
        lines.append("  none")
    for channel, counts in stats.outcomes.items():
        lines.append(f"  {channel:<6} " + ", ".join(f"{o} {n}" for o, n in sorted(counts.items())))
    lines.append("credentials refused, last hour:")
    lines += [f"  {channel:<6} {count}" for channel, count in stats.credentials_refused.items()] or ["  none"]
    lines.append(f"listener: {listener_summary(stats.listener, stats.generated)[0]}")
    if stats.node_go_listener is not None:  # only the legacy API's deployments run one
        lines.append(f"node-go listener: {node_go_summary(stats.node_go_listener, stats.generated)[0]}")
    return "\n".join(lines)


def run_healthcheck(settings: Settings, args: argparse.Namespace) -> int:
    from app.ops.healthcheck import check, process_arguments, served_command

    verdict = check(settings, served_command(process_arguments(args.pid)))
    print(verdict.line)
    return 0 if verdict.healthy else 1


def run_config_check(settings: Settings, args: argparse.Namespace) -> int:
    from app.ops.checks import channel_warnings, present_roles, run_checks

    roles = (args.role,) if args.role else present_roles(settings)
    print(f"checking for: {', '.join(roles)}")
    checks = asyncio.run(run_checks(settings, roles))
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name:<14} {check.detail}")
    warnings = channel_warnings(settings) if set(roles) & set(SENDING_ROLES) else []
    for warning in warnings:
        print(f"warn {warning.name:<14} {warning.detail}")
    failed = [check for check in checks if not check.ok]
    usable = f"configuration is usable{f' ({len(warnings)} warning(s))' if warnings else ''}"
    print(f"{len(failed)} check(s) failed" if failed else usable)
    return failed[0].exit_code if failed else 0  # the first failure's code (docs/configuration.md)


def run_legacy_import(settings: Settings, args: argparse.Namespace) -> int:
    from app.legacy.go_import import NotAGoDatabase, SourceFailed, UnusableSourceUrl, source_url
    from app.ops.failures import DATABASE_NOT_MIGRATED, SOURCE_OPTION, classify_source
    from app.ops.legacy_import import format_report, import_go_database

    try:
        source_url(args.source)
    except UnusableSourceUrl as error:
        print(f"xmtp-push: invalid argument: {SOURCE_OPTION}: {error}", file=sys.stderr)
        return 2
    try:
        report, binary = asyncio.run(import_go_database(settings, args.source, dry_run=args.dry_run))
    except NotAGoDatabase as error:
        print(f"xmtp-push: {SOURCE_OPTION}: {error}", file=sys.stderr)
        return DATABASE_NOT_MIGRATED
    except SourceFailed as error:
        failure = classify_source(error.__cause__ or error)
        if failure is None:
            raise
        print(failure.line(), file=sys.stderr)
        return failure.code
    ttl = settings.legacy_installation_ttl_seconds
    print(format_report(report, binary, dry_run=args.dry_run, ttl_seconds=ttl))
    return 0
