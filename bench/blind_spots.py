"""Blind spots: an outage with a backlog of 1,000,000 messages from 100,000 senders.

Two local servers; the real `stream-replicator` samples `fleet.<sender>` (age 1 h, `file` state)
and advises to a stream on the target, with an advisory age short enough that reading the backlog
takes longer than one resolution interval (a tenth of it). Every sender publishes once while the
replicator runs (all `new`); the replicator is stopped (the outage) while the fleet publishes the
backlog, in which `SILENT` senders never speak again; then the replicator is started again and reads
it. Read through the advisory stream and the fleet-health job:

- false timeouts: `timeout` advisories for senders that kept publishing (must be 0);
- caught: the silent senders advised `timeout` (must be all of them);
- the `blind_spot` advisory (must be published);
- fleet health: the silent senders `unknown`, their silence inside the blind spot.

`python -m bench.blind_spots [--messages N --senders N --silent N --advisory-age S]`; exit status 1
when an acceptance line fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.errors import NotFoundError

from bench.common import command_process, table
from replicator.demo.local_nats import LocalNatsServer


@contextlib.contextmanager
def replicator(work: Path, topic: dict[str, Any]) -> Iterator[Any]:
    """The real `stream-replicator`, its sender state in a file under `work` (saved at its clean stop)."""
    config = work / "sr.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(work / "state"), "topics": {"bench": topic}}))
    with command_process(["--config", str(config), "--topic", "bench"]) as proc:
        yield proc


async def publish(nc: nats.NATS, senders: range, rounds: int, skip: int = 0) -> None:
    """`rounds` messages from each sender in `senders` (but the first `skip`), pipelined."""
    js = nc.jetstream()
    futures = []
    for _ in range(rounds):
        for i in senders:
            if i < skip:
                continue
            futures.append(await js.publish_async(f"fleet.n{i}", b'{"ok":1}'))
            if len(futures) >= 4000:
                await asyncio.gather(*futures)
                futures.clear()
    await asyncio.gather(*futures)


async def keep_alive(nc: nats.NATS, senders: int, silent: int, period: float, stop: asyncio.Event,
                     rounds: list[float]) -> None:
    """Each active sender once per `period`; `rounds` gets how long each round took (a round longer
    than the advisory age would make its senders truly silent)."""
    while not stop.is_set():
        began = time.monotonic()
        await publish(nc, range(senders), 1, skip=silent)
        rounds.append(time.monotonic() - began)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, period - (time.monotonic() - began)))


async def advisories(nc: nats.NATS) -> list[dict[str, Any]]:
    js = nc.jetstream(timeout=30)
    total = (await js.stream_info("ADV")).state.messages
    if not total:
        return []
    sub = await js.pull_subscribe(">", stream="ADV", config=ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0))
    out: list[dict[str, Any]] = []
    while len(out) < total:
        out.extend(json.loads(m.data) for m in await sub.fetch(min(10_000, total - len(out)), timeout=10))
    await sub.unsubscribe()
    return out


async def wait_for(check: Any, within: float, every: float = 1.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(every)
    return False


async def pending(nc: nats.NATS) -> int:
    infos = await nc.jetstream().consumers_info("FLEET")
    return sum((i.num_pending or 0) + (i.num_ack_pending or 0) for i in infos)


async def scenario(work: Path, messages: int, senders: int, silent: int, advisory_age: float) -> dict[str, Any]:
    source = LocalNatsServer(name="bs-source", store_dir=work / "s").start()
    target = LocalNatsServer(name="bs-target", store_dir=work / "t").start()
    topic = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url, "name": "dc1",
             "inspect_subject_token": 2, "age": "1h", "limiter_state": "file",
             "advisory": {"target": "adv.%s", "age": f"{advisory_age}s", "reliable": True}}
    config = {**topic}
    try:
        src = await nats.connect(source.url)
        dst = await nats.connect(target.url)
        await src.jetstream().add_stream(StreamConfig(name="FLEET", subjects=["fleet.>"]))
        await dst.jetstream().add_stream(StreamConfig(name="FLEET", subjects=["fleet.>"], allow_batched=True))
        await dst.jetstream().add_stream(StreamConfig(name="ADV", subjects=["adv.>"]))
        with replicator(work, config) as proc:
            await publish(src, range(senders), 1)

            async def announced() -> bool:
                return (await dst.jetstream().stream_info("ADV")).state.messages >= senders

            if not await wait_for(announced, 600):
                raise RuntimeError(f"the live phase's new advisories did not all arrive (exit {proc.poll()})")
        # The outage: the fleet goes on (but the silent ones), nobody watches.
        rounds = max(1, -(-messages // (senders - silent)))
        began = time.time()
        await publish(src, range(senders), rounds, skip=silent)
        backlog = (senders - silent) * rounds
        span = time.time() - began
        if span < advisory_age:  # the silent ones must be silent longer than the advisory age, in stream time
            await asyncio.sleep(advisory_age - span)
            await publish(src, range(senders), 1, skip=silent)
            backlog += senders - silent
        # The fleet stays alive after the outage (but the silent ones): each active sender speaks
        # every third of the advisory age, so only the silent ones are truly silent.
        alive = asyncio.Event()
        keep_rounds: list[float] = []
        keepalive = asyncio.create_task(keep_alive(src, senders, silent, advisory_age / 3, alive, keep_rounds))
        restarted = time.monotonic()
        try:
            with replicator(work, config):
                async def blind_spot_published() -> bool:
                    try:
                        await dst.jetstream().get_last_msg("ADV", "adv.blind_spot")
                        return True
                    except NotFoundError:
                        return False

                if not await wait_for(blind_spot_published, 1800, 0.5):
                    raise RuntimeError("the backlog was not read (no blind spot advisory)")
                read_s = time.monotonic() - restarted
                await asyncio.sleep(advisory_age + 5)  # timeouts owed now would have been published
                found = await advisories(dst)
        finally:
            alive.set()
            await keepalive
        timeouts = {a["value"] for a in found if a.get("event") == "timeout"}
        silent_keys = {f"n{i}" for i in range(silent)}
        spots = [a for a in found if a.get("event") == "blind_spot"]
        fleet = await asyncio.to_thread(fleet_health, target.url, work / "fleet")
        return {"backlog": backlog, "senders": senders, "silent": silent, "advisory_age": advisory_age,
                "read_s": read_s, "false_timeouts": len(timeouts - silent_keys),
                "caught": len(timeouts & silent_keys), "blind_spots": len(spots),
                "unknown": fleet.get("unknown", 0), "fleet_timeout": fleet.get("timeout", 0),
                "longest_round": max(keep_rounds, default=0.0)}
    finally:
        source.close()
        target.close()


def fleet_health(url: str, output: Path) -> dict[str, Any]:
    from replicator.fleet_health.job import run_fleet_health

    return dict(run_fleet_health(url, "ADV", str(output), quiet=True).fleet)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.blind_spots")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--senders", type=int, default=100_000)
    parser.add_argument("--silent", type=int, default=1000)
    parser.add_argument("--advisory-age", type=float, default=60.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(scenario(Path(tmp), args.messages, args.senders, args.silent, args.advisory_age))
    resolution = min(max(r["advisory_age"] / 10, 0.1), 60.0)
    print(table(("backlog", "senders", "read (s)", "resolution (s)", "false timeouts", "caught", "blind spots",
                 "fleet unknown", "fleet timeout", "longest keep-alive round (s)"),
                [(f"{r['backlog']:,}", f"{r['senders']:,}", f"{r['read_s']:.1f}", f"{resolution:.1f}",
                  str(r["false_timeouts"]), f"{r['caught']}/{r['silent']}", str(r["blind_spots"]),
                  str(r["unknown"]), str(r["fleet_timeout"]), f"{r['longest_round']:.1f}")]))
    ok = (r["false_timeouts"] == 0 and r["caught"] == r["silent"] and r["blind_spots"] >= 1
          and r["unknown"] == r["silent"] and r["read_s"] > resolution)
    print("acceptance:", "holds" if ok else "FAILS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
