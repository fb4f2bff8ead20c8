"""`stream-replicator`: the entry point; each command lives in its own module.

The legacy form `stream-replicator --config sr.yaml --topic cmdb` still works: with no subcommand,
`run` is implied. The Go Stream Replicator's `stream-replicator [--debug] replicate --config FILE`
works too. Config errors exit with status 2 and a message naming the key and the file.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from replicator.cli import advisories, replicate, report, run, state
from replicator.cli.common import EXIT_CONFIG
from replicator.config.errors import ConfigError
from replicator.demo import embedded as demo
from replicator.fleet_health import cli as fleet_health
from replicator.transport.connections import ConnectError

SUBCOMMANDS = ("run", "replicate", "demo", "report", "advisories", "state", "fleet-health")
DEBUG_FLAG = "--debug"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-replicator",
        description="Replicate NATS JetStream streams, with sampling, advisories and fleet health.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_arguments(sub.add_parser("run", help="replicate one topic profile until SIGTERM/SIGINT"))
    replicate.add_arguments(sub.add_parser("replicate", help="replicate every profile (or stream) of a config "
                                                             "file in one process, as the Go tool does"))
    report.add_arguments(sub.add_parser("report", help="replication report per topic: streams, consumer, lag, "
                                                       "last active"))
    advisories.add_arguments(sub.add_parser("advisories", help="show (or --follow) a topic's advisories"))
    state.add_arguments(sub.add_parser("state", help="the senders the limiter tracks (file or KV state)"))
    fleet = sub.add_parser("fleet-health", help="the fleet-health Spark job (run, the default) and its report")
    fleet.set_defaults(fleet_help=fleet.print_help)
    actions = fleet.add_subparsers(dest="fleet_action", metavar="ACTION")
    fleet_health.add_arguments(actions.add_parser("run", help="run the fleet-health Spark job (the default action)"))
    fleet_health.add_report_arguments(actions.add_parser(
        "report", help="write one self-contained HTML page from the job's Parquet history"))
    demo.add_arguments(sub.add_parser("demo", help="the embedded default: local servers, a fleet, replication, "
                                                   "advisories and fleet health"))
    return parser


FLEET_ACTIONS = ("run", "report")


def _normalise(argv: list[str]) -> list[str]:
    """No subcommand means `run` (the legacy command line); a leading `--debug` (the Go tool's
    global flag, `stream-replicator --debug replicate ...`) moves behind the subcommand;
    `fleet-health` without an action means its `run`."""
    debug = False
    while argv and argv[0] == DEBUG_FLAG:
        argv, debug = argv[1:], True
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    if debug and argv and argv[0] in ("run", "replicate"):
        argv = [argv[0], DEBUG_FLAG, *argv[1:]]
    if argv[:1] == ["fleet-health"] and len(argv) > 1 and argv[1] not in (*FLEET_ACTIONS, "-h", "--help"):
        argv = ["fleet-health", "run", *argv[1:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _normalise(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    handlers = {"run": run.run, "replicate": replicate.run, "report": report.run, "advisories": advisories.run,
                "state": state.run}
    try:
        if args.command == "demo":
            return demo.run_from_args(args)
        if args.command == "fleet-health":
            if args.fleet_action == "report":
                return fleet_health.report_from_args(args)
            if args.fleet_action is None:
                args.fleet_help()
                return EXIT_CONFIG
            return fleet_health.run_from_args(args)
        return asyncio.run(handlers[args.command](args))
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
