"""`stream-replicator advisories`: show, or tail, the advisories of a topic.

    stream-replicator advisories --config sr.yaml --topic cmdb [--follow] [--since 10m]
                                 [--value REGEX] [--json]

Stored advisories are read from the stream that captures the advisory subject, with an ordered
consumer (nothing is left behind on the server). Without such a stream only `--follow` works: it
subscribes to the subject and shows what is published from now on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import signal
import sys
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from replicator.cli.common import EXIT_CONFIG, connect_side, duration_arg, regex_arg
from replicator.config.errors import ConfigError
from replicator.config.files import load_profile
from replicator.transport.jetstream import nothing_sent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file")
    parser.add_argument("--topic", required=True, help="profile name under `topics`")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep showing new advisories until interrupted")
    parser.add_argument("--since", type=duration_arg, metavar="DURATION",
                        help="only advisories stored in the last DURATION, e.g. 10m (default: all)")
    parser.add_argument("--value", type=regex_arg, help="only senders matching this regular expression")
    parser.add_argument("--json", action="store_true", help="print each advisory as one JSON line")


def _iso(ts: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(int(ts), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def subject_filter(template: str) -> str:
    """The subjects a templated advisory subject (`adv.%s.%v`) publishes to: `%s` is one token, a
    value may hold dots, so everything from the `%v` token on is `>`."""
    tokens = template.split(".")
    for i, token in enumerate(tokens):
        if "%v" in token:
            return ".".join([*tokens[:i], ">"])
        if "%s" in token:
            tokens[i] = "*"
    return ".".join(tokens)


def format_line(doc: dict[str, Any]) -> str:
    return (
        f"{_iso(doc.get('timestamp'))}  {doc.get('event', '?'):<8} {doc.get('value', '?')}  "
        f"age={doc.get('age', '?')}s  seen={_iso(doc.get('seen'))}  replicator={doc.get('replicator', '?')}"
    )


class _Printer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shown = 0

    def __call__(self, data: bytes) -> None:
        try:
            doc = json.loads(data)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        if self.args.value is not None and not self.args.value.search(str(doc.get("value", ""))):
            return
        self.shown += 1
        print(json.dumps(doc, separators=(",", ":")) if self.args.json else format_line(doc), flush=True)


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def run(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.config, args.topic)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    advisory = profile.settings.advisory
    if advisory is None:
        print(f"{args.config}: topic {args.topic!r} has no advisory configured", file=sys.stderr)
        return EXIT_CONFIG
    try:
        nc = await connect_side(
            profile, advisory.cluster, "stream-replicator-advisories", reconnect=args.follow
        )
    except (OSError, nats.errors.Error) as err:
        reason = err or type(err).__name__
        print(f"cannot connect to the {advisory.cluster} cluster: {reason}", file=sys.stderr)
        return 1
    printer = _Printer(args)
    subject = subject_filter(advisory.target)
    try:
        js = nc.jetstream()
        try:
            stream: str | None = await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            stream = None
        if stream is None and not args.follow:
            print(f"no stream on the {advisory.cluster} cluster stores {subject}: nothing to show "
                  f"(use --follow to watch advisories as they are published)", file=sys.stderr)
            return 1
        if stream is None:
            if args.since is not None:
                print("no stream stores the advisories: --since ignored, showing live ones", file=sys.stderr)

            async def live(msg: Msg) -> None:
                printer(msg.data)

            await nc.subscribe(subject, cb=live)
            await _until_interrupted()
            return 0
        await _read_stream(js, stream, subject, args, printer)
        return 0
    except (OSError, nats.errors.Error) as err:
        print(f"reading advisories failed: {err or type(err).__name__}", file=sys.stderr)
        return 1
    finally:
        await nc.close()


INACTIVE = 30.0  # seconds: a reader killed mid-read leaves no consumer behind for longer


async def _read_stream(
    js: Any, stream: str, subject: str, args: argparse.Namespace, printer: _Printer
) -> None:
    """An ordered consumer from `--since` (or the start); stops when caught up unless following."""
    if args.since is not None:
        start = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=args.since)
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start,
                                    inactive_threshold=INACTIVE)
    else:
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=INACTIVE)
    caught_up = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        printer(msg.data)
        if msg.metadata.num_pending == 0:
            caught_up.set()

    sub = await js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True, config=config)
    try:
        if nothing_sent(await sub.consumer_info()):
            caught_up.set()
        if args.follow:
            await _until_interrupted()
        else:
            await caught_up.wait()
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
