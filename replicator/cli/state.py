"""`stream-replicator state`: the senders a topic's limiter tracks, read from its file or KV store.

    stream-replicator state --config sr.yaml --topic cmdb [--value REGEX] [--older-than 10m] [--json]

The memory store lives only inside the running replicator and cannot be shown from outside.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

import nats
import nats.js.errors

from replicator.cli.common import EXIT_CONFIG, connect_side, duration_arg, regex_arg
from replicator.config.errors import ConfigError
from replicator.config.files import load_profile
from replicator.config.model import Profile
from replicator.sampling.state.file import load_state_file
from replicator.sampling.state.kv_bucket import read_kv_state
from replicator.sampling.state.records import Sender, limiter_bucket


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file")
    parser.add_argument("--topic", required=True, help="profile name under `topics`")
    parser.add_argument("--value", type=regex_arg, help="only senders matching this regular expression")
    parser.add_argument("--older-than", type=duration_arg, metavar="DURATION",
                        help="only senders not seen for at least this long, e.g. 10m")
    parser.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def _iso(ts: float) -> str:
    if ts <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(sender: Sender, now: float, age: float, advisory_age: float | None) -> str:
    """expired (past age), timeout (advised silent), silent (past the advisory age), ok."""
    silent = now - sender.seen
    if silent >= age:
        return "expired"
    if sender.adv > 0 and sender.seen <= sender.adv:
        return "timeout"
    if advisory_age is not None and silent >= advisory_age:
        return "silent"
    return "ok"


def rows(
    senders: dict[str, Sender], profile: Profile, now: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    age = float(profile.settings.age or 0)
    out = []
    for value in sorted(senders):
        s = senders[value]
        if args.value is not None and not args.value.search(value):
            continue
        if args.older_than is not None and now - s.seen < args.older_than:
            continue
        out.append({
            "value": value,
            "status": status(s, now, age, profile.settings.advisory_age),
            "first_seen": int(s.first),
            "last_seen": int(s.seen),
            "seen_ago": max(0, int(now - s.seen)),
            "last_copied": int(s.copied),
            "size": s.size,
        })
    return out


def format_table(items: list[dict[str, Any]], total: int) -> str:
    header = ("VALUE", "STATUS", "LAST SEEN", "AGO", "LAST COPIED", "FIRST SEEN", "SIZE")
    lines = [header]
    for r in items:
        lines.append((r["value"], r["status"], _iso(r["last_seen"]), f"{r['seen_ago']}s",
                      _iso(r["last_copied"]), _iso(r["first_seen"]), str(r["size"])))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    text.append(f"{len(items)} of {total} tracked senders")
    return "\n".join(text)


async def load_senders(profile: Profile) -> dict[str, Sender]:
    """Raises LookupError with a message for the user when there is nothing to read."""
    kind = profile.settings.limiter_state
    if kind == "memory":
        raise LookupError(
            "limiter_state is 'memory': the state lives inside the running replicator only "
            "(use limiter_state 'file' or 'kv' to inspect it)"
        )
    if kind == "file":
        path = profile.state_file()
        if not path.exists():
            return {}
        try:
            return load_state_file(path)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise LookupError(f"cannot read {path}: {err}") from None
    nc = await connect_side(profile, "source", "stream-replicator-state")
    try:
        return await read_kv_state(nc.jetstream(), limiter_bucket(profile))
    except nats.js.errors.NotFoundError:
        raise LookupError(f"no KV bucket {limiter_bucket(profile)} on the source yet") from None
    finally:
        await nc.close()


async def run(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.config, args.topic)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    if not profile.settings.sampling:
        print(f"{args.config}: topic {args.topic!r} does not sample (no inspect key)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        senders = await load_senders(profile)
    except LookupError as err:
        print(err.args[0], file=sys.stderr)
        return 1
    except (OSError, nats.errors.Error) as err:
        print(f"cannot read the KV state from the source: {err or type(err).__name__}", file=sys.stderr)
        return 1
    items = rows(senders, profile, time.time(), args)
    if args.json:
        print(json.dumps(items, indent=2))
    else:
        print(format_table(items, len(senders)))
    return 0
