"""`stream-replicator replicate --config FILE [--pid FILE] [--debug]`: every profile of a file in one
process, as the Go Stream Replicator's `replicate` runs every entry of its `streams:` list (and as
its systemd unit starts it). Works for legacy files too; `--topic` picks profiles, as the legacy
tool's `replicate --topic` did."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from replicator.cli.common import check_heartbeat_files, start_logging
from replicator.config.errors import ConfigError
from replicator.config.files import load_config
from replicator.config.model import Config, Profile
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
    p.add_argument("--reload", action="store_true",
                   help="reload the config file when it changes (a ConfigMap update) and on SIGHUP: profiles "
                        "added, changed or removed start, restart or stop; the others run on untouched")


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


def load(args: argparse.Namespace) -> tuple[Config, list[Profile]]:
    """The config file's profiles this process runs (`--topic`, else all), their files checked."""
    config = load_config(args.config)
    names = args.topic or list(config.topics)
    profiles = [Profile(config, name, instance=args.instance, source=str(args.config)) for name in names]
    for profile in profiles:
        profile.check_files()
    check_heartbeat_files(config, str(args.config))
    return config, profiles


async def run(args: argparse.Namespace) -> int:
    config, profiles = load(args)
    start_logging(config, debug=args.debug)
    log.debug("%s: %s format, profiles %s", args.config, config.dialect, ", ".join(p.profile for p in profiles))
    with pid_file(args.pid):
        process = ReplicatorProcess(config, profiles, monitor_port=args.monitor,
                                    loader=functools.partial(load, args) if args.reload else None,
                                    watch=str(args.config) if args.reload else None)
        process.install_signals()
        log.info("replicating %d stream(s)%s: %s%s", len(profiles),
                 " and heartbeats" if config.heartbeats else "", ", ".join(p.profile for p in profiles) or "-",
                 f" (reloading {args.config} when it changes)" if args.reload else "")
        tune_collector()
        await process.run()
    log.info("stopped cleanly")
    return 0
