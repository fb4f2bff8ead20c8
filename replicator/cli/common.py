"""What the command-line front ends share: exit codes, argument types, short-lived connections."""

from __future__ import annotations

import argparse
import re

from nats.aio.client import Client

from replicator.config.durations import parse_duration
from replicator.config.model import Profile

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
