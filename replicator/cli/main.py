"""`stream-replicator`: the entry point; each command lives in its own module.

The legacy form `stream-replicator --config sr.yaml --topic cmdb` still works: with no subcommand,
`run` is implied. The Go Stream Replicator's `stream-replicator [--debug] replicate --config FILE`
works too. Config errors exit with status 2 and a message naming the key and the file.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from replicator import add_version_argument
from replicator.cli.common import EXIT_CONFIG
from replicator.config.errors import ConfigError
from replicator.transport.websockets import import_nats_without_websockets

SUBCOMMANDS = ("run", "replicate", "demo", "report", "advisories", "state", "fleet-health")
DEBUG_FLAG = "--debug"

# command -> (the module that defines its arguments and runs it, its help line). A command's module
# is imported only when that command runs (or for `--help`): a worker loads no demo, Spark job or
# reporting code.
COMMANDS = {
    "run": ("replicator.cli.run", "replicate one topic profile until SIGTERM/SIGINT"),
    "replicate": ("replicator.cli.replicate", "replicate every profile (or stream) of a config file in one "
                                              "process, as the Go tool does"),
    "report": ("replicator.cli.report", "replication report per topic: streams, consumer, lag, last active"),
    "advisories": ("replicator.cli.advisories", "show (or --follow) a topic's advisories"),
    "state": ("replicator.cli.state", "the senders the limiter tracks (file or KV state)"),
    "fleet-health": ("replicator.fleet_health.cli", "the fleet-health Spark job (run, the default) and its report"),
    "demo": ("replicator.demo.embedded", "the embedded default: local servers, a fleet, replication, advisories "
                                         "and fleet health"),
}


def command_module(command: str) -> ModuleType:
    return importlib.import_module(COMMANDS[command][0])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or with `only` just that command's arguments (the others listed)."""
    parser = argparse.ArgumentParser(
        prog="stream-replicator",
        description="Replicate NATS JetStream streams, with sampling, advisories and fleet health.",
    )
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(command, help=help_text)
        if only is not None and command != only:
            continue
        module = command_module(command)
        if command != "fleet-health":
            module.add_arguments(p)
            continue
        p.set_defaults(fleet_help=p.print_help)
        actions = p.add_subparsers(dest="fleet_action", metavar="ACTION")
        module.add_arguments(actions.add_parser("run", help="run the fleet-health Spark job (the default action)"))
        module.add_report_arguments(actions.add_parser(
            "report", help="write one self-contained HTML page from the job's Parquet history"))
    return parser


FLEET_ACTIONS = ("run", "report")


def _normalise(argv: list[str]) -> list[str]:
    """No subcommand means `run` (the legacy command line); a leading `--debug` (the Go tool's
    global flag, `stream-replicator --debug replicate ...`) moves behind the subcommand;
    `fleet-health` without an action means its `run`."""
    debug = False
    while argv and argv[0] == DEBUG_FLAG:
        argv, debug = argv[1:], True
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    if debug and argv and argv[0] in ("run", "replicate"):
        argv = [argv[0], DEBUG_FLAG, *argv[1:]]
    if argv[:1] == ["fleet-health"] and len(argv) > 1 and argv[1] not in (*FLEET_ACTIONS, "-h", "--help"):
        argv = ["fleet-health", "run", *argv[1:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    import_nats_without_websockets()
    from replicator.transport.connections import ConnectError

    args_list = _normalise(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(args_list[0] if args_list and args_list[0] in COMMANDS else None)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    module = command_module(args.command)
    try:
        if args.command == "demo":
            return int(module.run_from_args(args))
        if args.command == "fleet-health":
            if args.fleet_action == "report":
                return int(module.report_from_args(args))
            if args.fleet_action is None:
                args.fleet_help()
                return EXIT_CONFIG
            return int(module.run_from_args(args))
        return int(asyncio.run(module.run(args)))
    except ConfigError as err:
        print(f"stream-replicator: config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except ConnectError as err:  # TLS, credentials or an unusable URL: retrying cannot help
        print(f"stream-replicator: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
