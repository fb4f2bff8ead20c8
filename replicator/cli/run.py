"""`stream-replicator run --config sr.yaml --topic cmdb`: replicate one profile until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import os

from replicator.cli.common import start_logging
from replicator.config.files import load_profile
from replicator.service.process import ReplicatorProcess, tune_collector

log = logging.getLogger("stream_replicator")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--topic", required=True, help="profile name under `topics`")
    p.add_argument("--instance", default=os.environ.get("SR_INSTANCE"),
                   help="unique suffix for worker (connection) names, e.g. the pod name (env SR_INSTANCE)")
    p.add_argument("--monitor", type=int, default=None, help="override the monitor port")
    p.add_argument("--debug", action="store_true", help="debug logging, whatever the config says")


async def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.config, args.topic, instance=args.instance)
    profile.check_files()
    cfg = profile.config
    start_logging(cfg, debug=args.debug)
    process = ReplicatorProcess(cfg, [profile], monitor_port=args.monitor)
    process.install_signals()
    mode = "ordered" if profile.settings.ordered else f"scaled ({profile.settings.workers} workers)"
    log.info("replicating %s (%s) as %s", profile.settings.topic, mode, profile.base_name)
    tune_collector()
    await process.run()
    log.info("stopped cleanly")
    return 0
