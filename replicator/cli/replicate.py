"""`stream-replicator replicate --config FILE [--pid FILE] [--debug]`: every profile of a file in one
process, as the Go Stream Replicator's `replicate` runs every entry of its `streams:` list (and as
its systemd unit starts it). Works for legacy files too; `--topic` picks profiles, as the legacy
tool's `replicate --topic` did."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from replicator.cli.common import check_heartbeat_files, start_logging
from replicator.config.errors import ConfigError
from replicator.config.files import load_config
from replicator.config.model import Profile
from replicator.service.process import ReplicatorProcess, tune_collector

log = logging.getLogger("stream_replicator")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config file (legacy `topics:` or the Go tool's `streams:`)")
    p.add_argument("--pid", help="write the process id to this file while running")
    p.add_argument("--debug", action="store_true", help="debug logging, whatever the config says")
    p.add_argument("--topic", action="append", metavar="PROFILE",
                   help="run only this profile (repeatable; default: all of them)")
    p.add_argument("--instance", default=os.environ.get("SR_INSTANCE"),
                   help="unique suffix for worker (connection) names, e.g. the pod name (env SR_INSTANCE)")
    p.add_argument("--monitor", type=int, default=None, help="override the monitor port")


@contextlib.contextmanager
def pid_file(path: str | None) -> Iterator[None]:
    """The pid in `path` while running; removed afterwards if it is still ours."""
    if not path:
        yield
        return
    pid = f"{os.getpid()}\n"
    try:
        Path(path).write_text(pid)
    except OSError as err:
        raise ConfigError(f"--pid {path}: cannot write the pid file: {err.strerror}") from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if Path(path).read_text() == pid:
                Path(path).unlink()


async def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    names = args.topic or list(config.topics)
    profiles = [Profile(config, name, instance=args.instance, source=str(args.config)) for name in names]
    for profile in profiles:
        profile.check_files()
    check_heartbeat_files(config, str(args.config))
    start_logging(config, debug=args.debug)
    log.debug("%s: %s format, profiles %s", args.config, config.dialect, ", ".join(p.profile for p in profiles))
    with pid_file(args.pid):
        process = ReplicatorProcess(config, profiles, monitor_port=args.monitor)
        process.install_signals()
        log.info("replicating %d stream(s)%s: %s", len(profiles),
                 " and heartbeats" if config.heartbeats else "", ", ".join(p.profile for p in profiles) or "-")
        tune_collector()
        await process.run()
    log.info("stopped cleanly")
    return 0
