"""`stream-replicator demo`: the embedded default, end to end on one machine.

Two local NATS servers play a site and the centre; a fleet emulator publishes registrations at the
site; the replicator samples them upward (each node at most once per `age`) and advises the centre
when nodes go quiet, come back or retire; at the end the fleet-health job turns the advisories into
site and fleet tables. Everything is started here and cleaned up here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig

from replicator.config.files import parse_config
from replicator.config.model import Profile
from replicator.demo.fleet import SUBJECT, FleetEmulator, build_fleet
from replicator.demo.local_nats import LocalNatsServer
from replicator.observe.metrics import Metrics
from replicator.service.runner import Replicator

ADVISORY_STREAM = "ADVISORIES"
ADVISORY_SUBJECT = "sr.advisories.ams"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=300, help="nodes in the emulated fleet (default 300)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of publishing (default 60)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a node's registrations")
    parser.add_argument("--age", type=float, default=10.0, help="sampling age: a node goes upward at most once per age")
    parser.add_argument("--no-fleet-health", action="store_true", help="skip the Spark fleet-health job at the end")


def demo_config(site_url: str, centre_url: str, age: float, interval: float) -> dict[str, Any]:
    return {
        "topics": {
            "registration": {
                "topic": f"{SUBJECT}.>",
                "source_url": site_url,
                "target_url": centre_url,
                "name": "ams",
                "target_stream": "REGISTRATION_CENTRE",
                "inspect": "sender",
                "update_flag": "updated",
                "age": f"{age}s",
                "advisory": {"target": ADVISORY_SUBJECT, "cluster": "target", "age": f"{interval * 2}s"},
            }
        }
    }


def _value(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def progress_line(metrics: Metrics, published: int, elapsed: float) -> str:
    labels = {"name": "ams", "worker": "ams_0"}
    received = _value(metrics, "stream_replicator_received_msgs_total", labels)
    copied = _value(metrics, "stream_replicator_copied_msgs_total", labels)
    skipped = _value(metrics, "stream_replicator_limiter_memory_skipped_total", labels)
    lag = _value(metrics, "stream_replicator_lag_msgs", labels)
    events = {e: int(_value(metrics, f"stream_replicator_advisories_{e}_total", labels))
              for e in ("new", "timeout", "recover", "expire")}
    adv = " ".join(f"{k}={v}" for k, v in events.items())
    return (f"[{elapsed:5.1f}s] published {published:6d}  received {int(received):6d}  copied {int(copied):5d}  "
            f"skipped {int(skipped):6d}  lag {int(lag):4d}  advisories: {adv}")


async def run_demo(args: argparse.Namespace, workdir: Path) -> int:
    site = LocalNatsServer(name="site", store_dir=workdir / "site").start()
    centre = LocalNatsServer(name="centre", store_dir=workdir / "centre").start()
    print(f"site NATS   {site.url}\ncentre NATS {centre.url}")
    try:
        site_nc = await nats.connect(site.url)
        centre_nc = await nats.connect(centre.url)
        await site_nc.jetstream().add_stream(StreamConfig(name="REGISTRATION", subjects=[f"{SUBJECT}.>"]))
        await centre_nc.jetstream().add_stream(StreamConfig(name=ADVISORY_STREAM, subjects=["sr.advisories.>"]))
        config = demo_config(site.url, centre.url, args.age, args.interval)
        profile = Profile(parse_config(config, "demo"), "registration", source="demo")
        replicator = Replicator(profile)
        # Quiet long enough to time out (2 intervals) but back before expiry (age): timeout, then recover.
        fleet = build_fleet(args.nodes, args.duration, interval=args.interval,
                            quiet_for=(args.interval * 2 + args.age) / 2 - args.interval)
        emulator = FleetEmulator(site_nc, fleet, interval=args.interval)
        print(f"fleet: {args.nodes} nodes every {args.interval}s for {args.duration}s; sampling age {args.age}s; "
              f"{sum(n.quiet_from is not None for n in fleet)} will go quiet, "
              f"{sum(n.retire_at is not None for n in fleet)} will retire\n")
        task = asyncio.ensure_future(replicator.run())
        publisher = asyncio.ensure_future(emulator.run(args.duration))
        started = time.monotonic()
        while not publisher.done():
            await asyncio.sleep(2.0)
            print(progress_line(replicator.metrics, emulator.published, time.monotonic() - started), flush=True)
        replicator.stop()
        await asyncio.wait_for(task, 30)
        info = await centre_nc.jetstream().stream_info("REGISTRATION_CENTRE")
        adv = await centre_nc.jetstream().stream_info(ADVISORY_STREAM)
        print(f"\nsite published {emulator.published} registrations; the centre received "
              f"{info.state.messages} ({info.state.messages / max(emulator.published, 1):.1%}) "
              f"and {adv.state.messages} advisories")
        await site_nc.close()
        await centre_nc.close()
        if not args.no_fleet_health:
            await asyncio.to_thread(_fleet_health, centre.url, workdir)
        return 0
    finally:
        site.close()
        centre.close()


def _fleet_health(url: str, workdir: Path) -> None:
    try:
        from replicator.fleet_health import format_tables, run_fleet_health
    except ImportError as err:  # PySpark is an extra: the demo still shows replication without it
        print(f"\nfleet health skipped: {err} (install with: pip install 'stream-replicator[spark]')")
        return
    print("\nfleet health (Spark local[2]) over the advisories at the centre:")
    result = run_fleet_health(url, ADVISORY_STREAM, str(workdir / "fleet-health"), partitions=2)
    print(format_tables(result))


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="sr-demo-") as tmp, contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run_demo(args, Path(tmp)))
    return 130


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="stream-replicator demo")
    add_arguments(parser)
    sys.exit(run_from_args(parser.parse_args()))
