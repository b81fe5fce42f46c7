"""The `xmtp-push` console script."""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any, NoReturn

from app.core.config import Settings, SettingsError, load_settings, unknown_setting_warnings
from app.core.logging import configure_logging

COMMANDS = {
    "dev": "everything in one process on embedded defaults (SQLite, in-process queue); migrates first",
    "api": "HTTP API (Connect, ingest, health, metrics; the Matrix notify route when configured) and gRPC API",
    "worker": "fan-out and delivery workers (needs XMTP_PUSH_REDIS_URL); run as many as you like",
    "listen": (
        "the network listeners: xmtpd's firehose and node-go's SubscribeAll (two or more for availability; "
        "needs XMTP_PUSH_XMTPD_ADDRESS or XMTP_PUSH_NODE_GO_ADDRESS, and XMTP_PUSH_REDIS_URL)"
    ),
    "migrate": "apply database migrations (alembic upgrade head)",
    "gateway": "the Matrix push gateway alone (needs XMTP_PUSH_MATRIX_APPS; no database)",
}

MARMOT_HELP = (
    "the Marmot notification server: gift-wrapped Nostr triggers from XMTP_PUSH_MARMOT_RELAYS to silent "
    "APNs and FCM pushes (needs XMTP_PUSH_MARMOT_SECRET_KEY)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmtp-push", description="Push notification backend for XMTP.")
    parser.add_argument("--version", action="version", version=f"xmtp-push {_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="log at DEBUG and show an operational failure's traceback"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        commands.add_parser(name, help=help_text, description=help_text)
    marmot = commands.add_parser("marmot", help=MARMOT_HELP, description=MARMOT_HELP)
    marmot.add_argument(
        "--show-pubkey",
        action="store_true",
        help="print the server's public key (64 hex characters, then npub1...) and exit",
    )
    _add_marmot_send_test(marmot.add_subparsers(dest="marmot_command", metavar="COMMAND"))
    from app.ops.commands import add_parsers

    add_parsers(commands)
    return parser


MARMOT_SEND_TEST_HELP = (
    "publish a real trigger for one device token, encrypted and gift-wrapped to the server's public key, "
    "to a relay, and say whether the relay accepted it (exit 0) or not (exit 1); needs no settings"
)


def _add_marmot_send_test(commands: Any) -> None:
    send = commands.add_parser("send-test", help=MARMOT_SEND_TEST_HELP, description=MARMOT_SEND_TEST_HELP)
    send.add_argument("--relay", required=True, help="the relay's ws:// or wss:// URL")
    send.add_argument("--platform", required=True, choices=("apns", "fcm"))
    send.add_argument("--token", required=True, help="the device token: APNs as hex, FCM as its text")
    send.add_argument(
        "--server", required=True, help="the server's public key: npub1... or 64 hex characters"
    )


def _marmot_send_test(args: argparse.Namespace) -> int:
    """`xmtp-push marmot send-test`: the verdict as one line on stdout."""
    from urllib.parse import urlsplit

    from app.marmot.giftwrap import one_token_trigger
    from app.marmot.keys import NPUB, InvalidServerKey, bech32_encode, parse_public_key
    from app.marmot.relay_session import relay_host
    from app.marmot.tokens import Platform, TokenError
    from workers.marmot_server import CONNECTION_ERRORS, PUBLISH_SECONDS, publish

    relay = urlsplit(args.relay)
    if relay.scheme not in ("ws", "wss") or not relay.hostname:
        _refuse_argument("--relay: not a ws:// or wss:// URL with a host")
    try:
        server = parse_public_key(args.server)
    except InvalidServerKey as error:
        _refuse_argument(f"--server: {error}")
    try:
        event = one_token_trigger(server, Platform[args.platform.upper()], args.token)
    except TokenError:
        _refuse_argument("--token: an APNs token is hex, an FCM token text; 1 to 1021 bytes either way")
    name = f"relay {relay_host(args.relay)}"
    try:
        published = asyncio.run(publish(args.relay, event))
    except TimeoutError:
        print(f"{name} gave no answer within {PUBLISH_SECONDS:g} s: the trigger may not have been taken")
        return 1
    except CONNECTION_ERRORS as error:
        print(f"{name} could not be reached ({type(error).__name__}): nothing was published")
        return 1
    if not published.accepted:
        print(f"{name} refused the trigger ({published.reason or 'no reason given'})")
        return 1
    npub = bech32_encode(NPUB, server)
    print(f"{name} accepted the trigger: one {args.platform} token, gift-wrapped to {npub}")
    return 0


def _version() -> str:
    try:
        return metadata.version("xmtp-push")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        from app import __version__

        return __version__


def _migrate(settings: Settings) -> None:
    from app.core.migrations import upgrade

    with expected_failures(settings):
        upgrade(settings)


def _migrate_command(settings: Settings) -> None:
    from app.core.migrations import head_revision

    _migrate(settings)
    print(f"database schema at {head_revision(settings)}, the newest")


def _api(settings: Settings) -> None:
    from workers.server import serve_api

    if settings.ingest_token and not settings.redis_url:
        _refuse(
            "XMTP_PUSH_REDIS_URL: required by `api` when XMTP_PUSH_INGEST_TOKEN is set "
            "(the in-process queue serves only `dev`)"
        )
    run_loop(settings, serve_api(settings))


def _worker(settings: Settings) -> None:
    from workers.server import serve_worker

    if not settings.redis_url:
        _refuse("XMTP_PUSH_REDIS_URL: required by `worker`")
    run_loop(settings, serve_worker(settings))


def _listen(settings: Settings) -> None:
    from app.ops.roles import needs_one_of
    from workers.server import serve_listener

    if not (settings.xmtpd_address or settings.node_go_address):
        _refuse(needs_one_of("listen"))
    if not settings.redis_url:
        _refuse("XMTP_PUSH_REDIS_URL: required by `listen`")
    run_loop(settings, serve_listener(settings))


def _gateway(settings: Settings) -> None:
    from workers.server import serve_gateway

    if not settings.matrix_apps:
        _refuse("XMTP_PUSH_MATRIX_APPS: required by `gateway`")
    run_loop(settings, serve_gateway(settings))


def _dev(settings: Settings) -> None:
    from workers.server import serve_dev

    if settings.marmot_configured:
        _marmot_key(settings)
        if not settings.marmot_relays:
            _refuse("XMTP_PUSH_MARMOT_RELAYS: required when XMTP_PUSH_MARMOT_SECRET_KEY is set")
        _refuse_marmot_problems(settings)
    _migrate(settings)
    run_loop(settings, serve_dev(settings))


def _marmot_key(settings: Settings) -> Any:
    """The configured Marmot key, or a refusal naming the setting (never its value)."""
    from app.marmot.keys import InvalidServerKey, ServerKey

    if not settings.marmot_configured:
        _refuse("XMTP_PUSH_MARMOT_SECRET_KEY: required by `marmot`")
    assert settings.marmot_secret_key is not None
    try:
        return ServerKey.parse(settings.marmot_secret_key.get_secret_value())
    except InvalidServerKey as error:
        _refuse(f"XMTP_PUSH_MARMOT_SECRET_KEY: {error}")


def _refuse_marmot_problems(settings: Settings) -> None:
    """What the Marmot server refuses at start beyond its key's form (app/marmot/startup.py)."""
    from app.marmot.startup import start_problems

    problems = start_problems(settings)
    if problems:
        _refuse("; ".join(problems))


def _show_pubkey(settings: Settings, key: Any) -> None:
    """The public key alone on stdout; a key file the server would refuse is said on stderr."""
    from app.marmot.startup import key_file_problem

    assert settings.marmot_secret_key is not None
    problem = key_file_problem(settings.marmot_secret_key.get_secret_value())
    if problem is not None:
        print(f"xmtp-push: warning: {problem} (`xmtp-push marmot` refuses it)", file=sys.stderr)
    print(key.public_hex)
    print(key.npub)


def _marmot(settings: Settings, args: argparse.Namespace) -> None:
    key = _marmot_key(settings)
    if args.show_pubkey:
        _show_pubkey(settings, key)
        return
    from app.delivery.registry import CHANNELS, FLAT_CHANNELS, ways_to_configure
    from app.marmot.dispatch import MARMOT_CHANNELS
    from workers.server import serve_marmot

    if not settings.marmot_relays:
        _refuse("XMTP_PUSH_MARMOT_RELAYS: required by `marmot`")
    if not any(FLAT_CHANNELS[channel].configured(settings) for channel in MARMOT_CHANNELS):
        labels = " or ".join(CHANNELS[channel].label for channel in MARMOT_CHANNELS)
        _refuse(f"`marmot` needs {labels} configured: {ways_to_configure(MARMOT_CHANNELS)}")
    _refuse_marmot_problems(settings)
    run_loop(settings, serve_marmot(settings))


def run_loop(settings: Settings, main: Coroutine[Any, Any, None]) -> None:
    from app.api.grpc_server import PortUnavailable
    from app.auth.key_source import KeysUnavailable
    from app.queue.base import PartitionCountMismatch

    try:
        with asyncio.Runner(loop_factory=_loop_factory(settings)) as runner:
            runner.run(main)
    except PortUnavailable as error:  # as uvicorn ends on a taken HTTP port: one line, exit 3
        print(f"xmtp-push: {error}", file=sys.stderr)
        raise SystemExit(3) from None
    except PartitionCountMismatch as error:  # a setting that does not fit the queue: one line, exit 2
        print(f"xmtp-push: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeysUnavailable as error:  # no usable JWKS at start, or none for too long: one line, exit 10
        print(f"xmtp-push: {error}", file=sys.stderr)
        raise SystemExit(10) from None


def _loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if settings.event_loop != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:  # not built for this platform: the standard loop serves
        return None
    return uvloop.new_event_loop


def _refuse(message: str) -> None:
    print(f"xmtp-push: invalid configuration: {message}", file=sys.stderr)
    raise SystemExit(2)


def _refuse_argument(message: str) -> NoReturn:
    print(f"xmtp-push: invalid argument: {message}", file=sys.stderr)
    raise SystemExit(2)


RUNNERS = {
    "dev": _dev,
    "api": _api,
    "worker": _worker,
    "listen": _listen,
    "migrate": _migrate_command,
    "gateway": _gateway,
}
SERVING = {"dev", "api", "worker", "listen"}
# Commands that serve the Matrix gateway when XMTP_PUSH_MATRIX_APPS is set.
MATRIX_SERVING = {"dev", "api", "gateway"}
# Commands whose pushes use the flat settings' channels (`listen` only reads the network).
SENDING = {"dev", "api", "worker", "marmot", "send-test"}
# Commands meant for a person: their answer on stdout, and only log lines that call for attention.
FOR_A_PERSON = {"config", "stats", "send-test", "migrate", "healthcheck", "legacy"}


def _operator_command(settings: Settings, args: argparse.Namespace) -> int:
    from app.ops import commands

    runner = {
        "send-test": commands.run_send_test,
        "stats": commands.run_stats,
        "config": commands.run_config_check,
        "healthcheck": commands.run_healthcheck,
        "legacy": commands.run_legacy_import,
    }[args.command]
    with expected_failures(settings):
        return runner(settings, args)


@contextmanager
def expected_failures(settings: Settings) -> Iterator[None]:
    """An operational failure (a database or Redis unreachable, ...) ends the command with one line
    naming the setting, and its own exit code; its traceback too only at log level DEBUG."""
    try:
        yield
    except Exception as error:
        from app.ops.failures import classify

        failure = classify(error)
        if failure is None:
            raise
        if settings.log_level == "DEBUG":
            traceback.print_exc()
        print(failure.line(), file=sys.stderr)
        raise SystemExit(failure.code) from None


def _log_level(args: argparse.Namespace, settings: Settings) -> str:
    """A person's command logs WARNING and above, unless asked for DEBUG (--debug included)."""
    marmot_tool = getattr(args, "show_pubkey", False) or getattr(args, "marmot_command", None)
    for_a_person = args.command in FOR_A_PERSON or bool(marmot_tool)
    if for_a_person and settings.log_level == "INFO":
        return "WARNING"
    return settings.log_level


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging("WARNING")
    for warning in unknown_setting_warnings():
        print(f"xmtp-push: warning: {warning}", file=sys.stderr)
    try:
        settings = load_settings()
        if args.debug:
            settings = settings.model_copy(update={"log_level": "DEBUG"})
        configure_logging(_log_level(args, settings))
        marmot_serving = args.command == "marmot" and not (args.show_pubkey or args.marmot_command)
        serving = args.command in SERVING or marmot_serving
        if serving or args.command == "send-test":
            from app.delivery.registry import default_apps, refuse_half_set_channels

            if args.command in SENDING:
                refuse_half_set_channels(settings)  # so does a channel half set
            default_apps(settings)  # a configured channel's unusable credential stops start-up
        if args.command in MATRIX_SERVING and settings.matrix_apps:
            from app.delivery.url_policy import UrlPolicy
            from app.matrix.config import load_gateway_config

            # so does a bad gateway app
            load_gateway_config(settings.matrix_apps, UrlPolicy.from_settings(settings))
    except SettingsError as error:
        print(f"xmtp-push: {error}", file=sys.stderr)
        return 2
    if args.command == "marmot" and args.marmot_command == "send-test":
        return _marmot_send_test(args)
    if args.command == "marmot":
        _marmot(settings, args)
        return 0
    if args.command not in RUNNERS:
        return _operator_command(settings, args)
    RUNNERS[args.command](settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
