"""End-to-end latency at a steady rate: the ordered copier against NATS's own mirror over a
leafnode, side by side in the same run.

Run: `python -m bench.latency [--rates 2000,200] [--seconds 20] [--repeat 3]`. One publisher sends
each message, its publish time (monotonic ns) in the payload, to both sources at once: the site
of a native cross-domain mirror (`leaf` -> `hub`) and the source the copier reads (`source` ->
`target`, a `stream-replicator` process with its defaults). A push consumer on each far side
reads the stored copies as they land; latency is the read time minus the publish time, all taken
in this process. The first `--warmup` seconds are not counted. Every percentile is printed as a
ratio to the mirror's in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ExternalStream, StreamConfig, StreamSource

from bench.common import connect, replicator_process, table
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.compiled import describe

PAYLOAD = 256  # bytes: fleet metadata is a few hundred bytes a message
PERCENTILES = (50, 90, 99, 99.9)


@dataclass
class Latencies:
    """Read time minus publish time of every message read after the warm-up (ns)."""

    name: str
    since_ns: int = 0
    samples: list[int] = field(default_factory=list)
    read: int = 0

    async def on_msg(self, msg: Msg) -> None:
        now = time.monotonic_ns()
        self.read += 1
        sent = int(msg.data[:20])
        if sent >= self.since_ns:
            self.samples.append(now - sent)

    def percentile(self, p: float) -> float:
        """In milliseconds."""
        ordered = sorted(self.samples)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] / 1e6


async def reader(nc: Client, stream: str, latencies: Latencies) -> None:
    """A push consumer on `stream` that delivers new messages as they are stored, unacknowledged."""
    config = ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE, flow_control=True,
                            idle_heartbeat=5.0)
    await nc.jetstream().subscribe("fleet.>", stream=stream, config=config, cb=latencies.on_msg,
                                   manual_ack=True)


async def publish_steadily(sources: list[Client], rate: float, seconds: float) -> int:
    """One message per 1/`rate` s to every source (the same publish time in each), by the clock:
    a late wake-up sends what fell due, not a burst to catch up on a schedule of its own."""
    interval = 1e9 / rate
    began = time.monotonic_ns()
    end = began + int(seconds * 1e9)
    sent = 0
    pad = b"." * PAYLOAD
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        due = began + int(sent * interval)
        while due <= now:
            body = str(time.monotonic_ns()).encode().rjust(20, b"0") + pad[20:]
            for nc in sources if sent % 2 else reversed(sources):  # neither side always first
                await nc.publish("fleet.m", body)
            sent += 1
            due = began + int(sent * interval)
        await asyncio.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
    for nc in sources:
        await nc.flush()
    return sent


async def wait_read(sides: list[Latencies], count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.read >= count for s in sides):
            return
        await asyncio.sleep(0.1)


async def one_run(rate: float, seconds: float, warmup: float, work: Path) -> tuple[Latencies, Latencies]:
    hub = LocalNatsServer(name="hub", store_dir=work / "hub", domain="hub", leafnode_listen=True).start()
    leaf = LocalNatsServer(name="leaf", store_dir=work / "leaf", domain="leaf",
                           leafnode_remote=f"nats://127.0.0.1:{hub.leafnode_port}").start()
    source = LocalNatsServer(name="source", store_dir=work / "source").start()
    target = LocalNatsServer(name="target", store_dir=work / "target").start()
    try:
        await asyncio.sleep(1.0)  # the leafnode connection
        leaf_nc, hub_nc, src_nc, dst_nc = [await connect(s.url) for s in (leaf, hub, source, target)]
        for nc in (leaf_nc, src_nc):
            await nc.jetstream().add_stream(StreamConfig(name="FLEET", subjects=["fleet.>"]))
        await hub_nc.jetstream().add_stream(StreamConfig(
            name="MIRROR", mirror=StreamSource(name="FLEET", external=ExternalStream(api="$JS.leaf.API"))))
        native, copier = Latencies("native mirror (leafnode)"), Latencies("ordered copier")
        topic = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url, "name": "latency"}
        with replicator_process(work, "latency", topic):
            # Both far sides exist and are read before the measured traffic: a first message proves it.
            await src_nc.jetstream().publish("fleet.m", b"0".rjust(20, b"0"))
            await leaf_nc.jetstream().publish("fleet.m", b"0".rjust(20, b"0"))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if (await dst_nc.jetstream().stream_info("FLEET")).state.messages:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.1)
            await reader(hub_nc, "MIRROR", native)
            await reader(dst_nc, "FLEET", copier)
            native.since_ns = copier.since_ns = time.monotonic_ns() + int(warmup * 1e9)
            sent = await publish_steadily([leaf_nc, src_nc], rate, warmup + seconds)
            await wait_read([native, copier], sent)
        for nc in (leaf_nc, hub_nc, src_nc, dst_nc):
            await nc.close()
        return native, copier
    finally:
        for server in (leaf, hub, source, target):
            server.close()
        shutil.rmtree(work, ignore_errors=True)


def report(rate: float, native: Latencies, copier: Latencies) -> list[tuple[str, ...]]:
    rows = []
    for side in (native, copier):
        cells = [f"{side.percentile(p):.2f}" for p in PERCENTILES]
        ratios = [f"{side.percentile(p) / native.percentile(p):.2f}x" for p in (50, 99)]
        rows.append((f"{rate:,.0f}", side.name, f"{len(side.samples):,}", *cells, *ratios))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="2000,200", help="messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds published before measuring")
    parser.add_argument("--repeat", type=int, default=3, help="runs, each with its own mirror (medians printed)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    print(f"Latency, publish to stored copy read on the far side: ordered copier vs NATS's own mirror over a "
          f"leafnode, side by side ({PAYLOAD} B; {describe()})")
    headers = ("msgs/s", "path", "messages", *(f"p{p:g} ms" for p in PERCENTILES), "p50 x mirror", "p99 x mirror")
    ratios: dict[tuple[float, int], list[float]] = {}
    for run in range(args.repeat):
        rows = []
        for rate in rates:
            with tempfile.TemporaryDirectory(prefix="sr-bench-latency-") as tmp:
                native, copier = asyncio.run(one_run(rate, args.seconds, args.warmup, Path(tmp)))
            rows += report(rate, native, copier)
            for p in (50, 99):
                ratios.setdefault((rate, p), []).append(copier.percentile(p) / native.percentile(p))
        print(f"run {run + 1}:")
        print(table(headers, rows), flush=True)
    if args.repeat > 1:
        print(f"Over {args.repeat} runs (each against the mirror of its own run):")
        print(table(("msgs/s", "percentile", "median x mirror", "range"),
                    [(f"{rate:,.0f}", f"p{p}", f"{statistics.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}")
                     for (rate, p), v in sorted(ratios.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
