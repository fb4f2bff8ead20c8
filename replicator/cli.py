"""`stream-replicator`: run a profile, the demo, reports and the operational subcommands.

The legacy form `stream-replicator --config sr.yaml --topic cmdb` still works: with no subcommand,
`run` is implied. Config errors exit with status 2 and a message naming the key and the file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from replicator.config import ConfigError, load_config, load_profile
from replicator.connections import ConnectError
from replicator.logs import setup_logging

EXIT_CONFIG = 2
log = logging.getLogger("stream_replicator")

SUBCOMMANDS = ("run", "demo", "report", "advisories", "state", "fleet-health")


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="replicate one topic profile until SIGTERM/SIGINT")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--topic", required=True, help="profile name under `topics`")
    p.add_argument("--instance", default=os.environ.get("SR_INSTANCE"),
                   help="unique suffix for worker (connection) names, e.g. the pod name (env SR_INSTANCE)")
    p.add_argument("--monitor", type=int, default=None, help="override the monitor port")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-replicator",
        description="Replicate NATS JetStream streams, with sampling, advisories and fleet health.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    p = sub.add_parser("report", help="replication report per topic: streams, consumer, lag, last active")
    p.add_argument("--config", required=True)
    p.add_argument("--topic", action="append", help="only these profiles (repeatable)")
    from replicator import advisories_cli, demo, state_cli

    advisories_cli.add_arguments(sub.add_parser("advisories", help="show (or --follow) a topic's advisories"))
    state_cli.add_arguments(sub.add_parser("state", help="the senders the limiter tracks (file or KV state)"))
    from replicator.fleet_health import cli as fleet_health_cli

    fleet_health_cli.add_arguments(sub.add_parser("fleet-health", help="run the fleet-health Spark job locally"))
    demo.add_arguments(sub.add_parser("demo", help="the embedded default: local servers, a fleet, replication, "
                                                   "advisories and fleet health"))
    return parser


def _normalise(argv: list[str]) -> list[str]:
    """No subcommand means `run` (the legacy command line)."""
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        return ["run", *argv]
    return argv


async def _run(args: argparse.Namespace) -> int:
    from replicator.runner import Replicator

    profile = load_profile(args.config, args.topic, instance=args.instance)
    profile.check_files()
    cfg = profile.config
    setup_logging(debug=cfg.debug, logfile=cfg.logfile, log_format=cfg.log_format)
    replicator = Replicator(profile, monitor_port=args.monitor)
    replicator.install_signals()
    mode = "ordered" if profile.settings.ordered else f"scaled ({profile.settings.workers} workers)"
    log.info("replicating %s (%s) as %s", profile.settings.topic, mode, profile.base_name)
    await replicator.run()
    log.info("stopped cleanly")
    return 0


async def _report(args: argparse.Namespace) -> int:
    from replicator.report import build_report, format_report

    config = load_config(args.config)
    rows = await build_report(config, args.config, args.topic)
    print(format_report(rows))
    return 1 if any(r.error for r in rows) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _normalise(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    from replicator import advisories_cli, state_cli

    handlers = {"run": _run, "report": _report, "advisories": advisories_cli.run, "state": state_cli.run}
    try:
        if args.command == "demo":
            from replicator import demo

            return demo.run_from_args(args)
        if args.command == "fleet-health":
            from replicator.fleet_health import cli as fleet_health_cli

            return fleet_health_cli.run_from_args(args)
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
