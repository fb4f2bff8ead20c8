"""`stream-replicator demo`: the embedded default, end to end on one machine.

Four local NATS servers play two cities, a region and the centre (`tree.py`); a fleet emulator in
each city publishes registrations; five replications copy them up the tree, sample them at the
region and advise the centre when nodes go quiet, come back or retire. Meanwhile the fleet-health
job runs every few seconds over the advisories at the centre (`fleet_runs.py`), and at the end the
demo prints the last run's tables and writes the HTML report. Everything is started and cleaned up
here; only the report stays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.js.api import StreamConfig

from replicator.config.files import parse_config
from replicator.config.model import Profile
from replicator.demo.fleet import FleetEmulator, build_fleet
from replicator.demo.fleet_runs import PeriodicFleetHealth
from replicator.demo.local_nats import LocalNatsServer
from replicator.demo.tree import (
    ADVISORY_HOP,
    ADVISORY_STREAM,
    ADVISORY_SUBJECTS,
    CITIES,
    STREAM,
    SUBJECT,
    tree_config,
)
from replicator.observe.metrics import Metrics
from replicator.service.runner import Replicator
from replicator.transport.errors import NATS_ERRORS

REPORT_NAME = Path("stream-replicator-demo") / "fleet-health.html"


def default_report() -> Path:
    """Resolved when the demo runs, not at import: images run with no writable temporary directory."""
    return Path(tempfile.gettempdir()) / REPORT_NAME
EVENTS = ("new", "timeout", "recover", "expire")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=200, help="nodes per city (default 200)")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of publishing (default 45)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a node's registrations")
    parser.add_argument("--age", type=float, default=10.0, help="sampling age: a node goes upward at most once per age")
    parser.add_argument("--fleet-every", type=float, default=15.0,
                        help="seconds between fleet-health runs while the fleet publishes (default 15)")
    parser.add_argument("--report", type=Path, default=None,
                        help="where the HTML report goes (default: the temporary directory's stream-replicator-demo/)")
    parser.add_argument("--no-fleet-health", action="store_true", help="skip the Spark fleet-health job and report")
    parser.add_argument("--verbose", action="store_true", help="also print Spark's start-up messages and warnings")


def total(metrics: Metrics, name: str) -> float:
    """A metric summed over its workers."""
    return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


def progress_line(replicators: dict[str, Replicator], published: int, elapsed: float, runs: int) -> str:
    def of(hops: tuple[str, ...], metric: str) -> int:
        return int(sum(total(replicators[h].metrics, f"stream_replicator_{metric}") for h in hops))

    up, samplers = tuple(f"{c}_region" for c in CITIES), CITIES
    adv = " ".join(f"{e}={of(samplers, f'advisories_{e}_total')}" for e in EVENTS)
    skipped = of(samplers, "limiter_memory_skipped_total")
    return (f"[{elapsed:5.1f}s] published {published:6d}  region {of(up, 'copied_msgs_total'):6d}  "
            f"centre {of(samplers, 'copied_msgs_total'):5d} (sampled out {skipped:6d})  advisories {adv}  "
            f"fleet-health runs {runs}")


async def _count(nc: Client, stream: str) -> int:
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    except NATS_ERRORS:  # not there yet
        return 0


async def _until(check: Callable[[], Awaitable[bool]], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.2)
    return await check()


async def run_demo(args: argparse.Namespace, workdir: Path) -> int:
    servers = {name: LocalNatsServer(name=name, store_dir=workdir / name).start()
               for name in (*CITIES, "region", "centre")}
    ncs: dict[str, Client] = {}
    replicators: dict[str, Replicator] = {}
    tasks: dict[str, asyncio.Future[None]] = {}
    fleet_health = None
    try:
        for name, server in servers.items():
            print(f"{name:7s} NATS {server.url}")
            ncs[name] = await nats.connect(server.url)
        for site in (*CITIES, "region"):  # the region's too: its samplers start before the cities' copies land
            await ncs[site].jetstream().add_stream(StreamConfig(name=STREAM, subjects=[f"{SUBJECT}.>"]))
        await ncs["region"].jetstream().add_stream(StreamConfig(name=ADVISORY_STREAM, subjects=[ADVISORY_SUBJECTS]))
        config = tree_config({n: s.url for n, s in servers.items()}, age=args.age, interval=args.interval)
        parsed = parse_config(config, "demo")
        for hop in config["topics"]:
            replicators[hop] = Replicator(Profile(parsed, hop, source="demo"))
        # Quiet long enough to time out (2 intervals) but back before expiry (age): timeout, then recover.
        quiet_for = (args.interval * 2 + args.age) / 2 - args.interval
        emulators = [FleetEmulator(ncs[city], build_fleet(args.nodes, args.duration, site=city, seed=42 + i,
                                                          interval=args.interval, quiet_for=quiet_for),
                                   interval=args.interval, subject=f"{SUBJECT}.{city}")
                     for i, city in enumerate(CITIES)]
        quiet = sum(n.quiet_from is not None for e in emulators for n in e.fleet)
        retire = sum(n.retire_at is not None for e in emulators for n in e.fleet)
        print(f"\ntree: {' + '.join(CITIES)} -> region (ordered, every message) -> centre (sampled per city, "
              f"each node at most once per {args.age:g}s); advisories from the region up to the centre")
        print(f"fleet: {args.nodes} nodes per city every {args.interval:g}s for {args.duration:g}s; {quiet} will go "
              f"quiet for a while, {retire} will retire\n")
        if not args.no_fleet_health:
            fleet_health = PeriodicFleetHealth(servers["centre"].url, ADVISORY_STREAM, workdir / "fleet-health",
                                               args.fleet_every, verbose=args.verbose)
            fleet_health.start()
        for hop, replicator in replicators.items():
            tasks[hop] = asyncio.ensure_future(replicator.run())
        if fleet_health is not None:
            print(f"starting Spark (local[2]) for fleet health every {args.fleet_every:g}s ...", flush=True)
            waited = time.monotonic()
            await asyncio.to_thread(fleet_health.ready.wait)
            print(f"fleet health unavailable: {fleet_health.unavailable}" if fleet_health.unavailable
                  else f"Spark ready after {time.monotonic() - waited:.0f}s\n", flush=True)
            fleet_health.begin()
        publishers = [asyncio.ensure_future(e.run(args.duration)) for e in emulators]
        started = time.monotonic()
        while not all(p.done() for p in publishers):
            await asyncio.wait(publishers, timeout=3.0)
            runs = len(fleet_health.results) if fleet_health else 0
            print(progress_line(replicators, sum(e.published for e in emulators), time.monotonic() - started, runs),
                  flush=True)
        for p in publishers:
            p.result()
        await _wind_down(replicators, tasks, ncs, sum(e.published for e in emulators))
        await _summary(ncs, emulators, args)
        if fleet_health is not None:
            report = args.report or default_report()
            await asyncio.to_thread(_fleet_health_end, fleet_health, workdir / "fleet-health", report)
        return 0
    finally:
        for replicator in replicators.values():
            replicator.stop()
        for task in tasks.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()
        if fleet_health is not None:
            fleet_health.finish()
        for server in servers.values():
            server.close()


async def _wind_down(replicators: dict[str, Replicator], tasks: dict[str, asyncio.Future[None]],
                     ncs: dict[str, Client], published: int) -> None:
    """Stop the samplers at once (left running without registrations they would announce every node
    timed out), let the ordered hops deliver what they hold, then stop them too."""
    async def stop(*hops: str) -> None:
        for hop in hops:
            replicators[hop].stop()
        await asyncio.gather(*(asyncio.wait_for(tasks[hop], 30) for hop in hops))

    await stop(*CITIES)
    await _until(lambda: _at_least(ncs["region"], STREAM, published), 15)

    async def advisories_up() -> bool:
        return await _count(ncs["centre"], ADVISORY_STREAM) >= await _count(ncs["region"], ADVISORY_STREAM)

    await _until(advisories_up, 15)
    await stop(*(f"{c}_region" for c in CITIES), ADVISORY_HOP)


async def _at_least(nc: Client, stream: str, expected: int) -> bool:
    return await _count(nc, stream) >= expected


async def _summary(ncs: dict[str, Client], emulators: list[FleetEmulator], args: argparse.Namespace) -> None:
    published = sum(e.published for e in emulators)
    region, centre = await _count(ncs["region"], STREAM), await _count(ncs["centre"], STREAM)
    advisories = await _count(ncs["centre"], ADVISORY_STREAM)
    cities = ", ".join(f"{c} {e.published}" for c, e in zip(CITIES, emulators, strict=True))
    print(f"\ncities published {published} registrations ({cities}); the region holds {region}, the centre "
          f"{centre} ({centre / max(published, 1):.1%}: each node at most once per {args.age:g}s) and "
          f"{advisories} advisories")


def _fleet_health_end(fleet_health: PeriodicFleetHealth, output: Path, report: Path) -> None:
    print("\nfleet health: a last run after replication stopped, over every advisory at the centre", flush=True)
    result = fleet_health.finish()
    if fleet_health.unavailable:
        print(f"fleet health skipped: {fleet_health.unavailable}")
        return
    if result is None:
        print("fleet health: no run succeeded")
        return
    from replicator.fleet_health.report import format_tables

    print(f"\n{format_tables(result)}")
    try:
        from replicator.fleet_health.html_report import write_report
    except ImportError as err:
        print(f"\nreport skipped: {err} (install with: pip install 'stream-replicator[report]')")
        return
    history = write_report(str(output), report)
    print(f"\nreport ({len(history.runs)} fleet-health runs, {len(history.nodes)} nodes): {report.resolve()}")


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
