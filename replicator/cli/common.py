"""What the command-line front ends share: exit codes, argument types, short-lived connections."""

from __future__ import annotations

import argparse
import logging
import os
import re
from typing import TYPE_CHECKING

from replicator.config.durations import parse_duration
from replicator.config.errors import ConfigError
from replicator.config.model import Config, Profile
from replicator.config.urls import url_options

if TYPE_CHECKING:
    from nats.aio.client import Client

EXIT_CONFIG = 2


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def regex_arg(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {err}") from None


async def connect_side(profile: Profile, side: str, name: str, *, reconnect: bool = False) -> Client:
    """A short-lived CLI connection with the profile's URLs, credentials and TLS: it fails fast
    instead of retrying a dead server for ever (or keeps retrying briefly with `reconnect`)."""
    from replicator.transport.connections import connect_once

    async def quiet(_: Exception) -> None:
        return None

    return await connect_once(profile, side, name,  # type: ignore[arg-type]
                              max_reconnect_attempts=10 if reconnect else 1, reconnect_time_wait=1, error_cb=quiet)


def start_logging(config: Config, *, debug: bool = False) -> None:
    """Logging as the config asks (`--debug` wins), then the warnings loading the config produced."""
    from replicator.observe.logs import setup_logging

    level = "debug" if debug or config.debug else config.log_level
    setup_logging(level=level, logfile=config.logfile, log_format=config.log_format)
    for warning in config.warnings:
        logging.getLogger("stream_replicator").warning("%s", warning)


def check_heartbeat_files(config: Config, source: str) -> None:
    """The heartbeats' TLS and credentials files must be readable at start (exit 2 otherwise)."""
    hb = config.heartbeats
    if hb is None:
        return
    go = config.dialect == "go"
    files: list[tuple[str, str | None]] = []
    if hb.tls is not None:
        files += [(f"heartbeats.tls.{label}", path) for label, path in zip(("ca", "cert", "key"), hb.tls.files(),
                                                                             strict=True)]
    files += [("heartbeats.credentials", hb.credentials),
              ("heartbeats.choria.jwt_file" if go else "heartbeats.jwt_file", hb.jwt_file),
              ("heartbeats.choria.seed_file" if go else "heartbeats.seed_file", hb.seed_file),
              ("heartbeats.user_file", hb.user_file), ("heartbeats.password_file", hb.password_file),
              ("heartbeats.nkey_file", hb.nkey_file), ("heartbeats.token_file", hb.token_file)]
    opts = url_options(hb.url)
    files += [("heartbeats.url", opts.credentials), ("heartbeats.url", opts.jwt), ("heartbeats.url", opts.nkey)]
    for key, path in files:
        if path and not os.access(path, os.R_OK):
            raise ConfigError(f"{source}: {key}: file {path} is not readable")
