"""Copier throughput against NATS's own cross-domain mirror over a leafnode, measured in one run.

Run: `python -m bench.dataplane` (or `make bench`). Every figure is also printed as a ratio to the
reference of the same payload size, because absolute rates on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nats.js.api import ExternalStream, StreamConfig, StreamSource

from bench.common import connect, cpu_seconds, preload, proxy_process, replicator_process, table, time_fill
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.compiled import describe


@dataclass
class Result:
    name: str
    size: int
    count: int
    seconds: float
    cpu: float = 0.0  # the copier process's CPU seconds over the same span (0: not measured)

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def mbps(self) -> float:
        return self.rate * self.size / 1e6


async def native_mirror(size: int, count: int, workdir: Path) -> Result:
    """The reference: a stream on the 'centre' mirroring the 'site' across JetStream domains over a leafnode."""
    hub = LocalNatsServer(name="hub", store_dir=workdir / "hub", domain="hub", leafnode_listen=True).start()
    leaf = LocalNatsServer(name="leaf", store_dir=workdir / "leaf", domain="leaf",
                           leafnode_remote=f"nats://127.0.0.1:{hub.leafnode_port}").start()
    try:
        await asyncio.sleep(1.0)  # leafnode connection
        src = await connect(leaf.url)
        dst = await connect(hub.url)
        await preload(src, "FLEET", "fleet", count, size)
        await dst.jetstream().add_stream(StreamConfig(
            name="MIRROR", mirror=StreamSource(name="FLEET", external=ExternalStream(api="$JS.leaf.API"))))
        seconds = await time_fill(dst, "MIRROR", count)
        await src.close()
        await dst.close()
        return Result("native mirror (leafnode)", size, count, seconds)
    finally:
        leaf.close()
        hub.close()
        discard(workdir)


async def copier(name: str, size: int, count: int, workdir: Path, *, workers: int = 1, delay: float = 0.0) -> Result:
    source = LocalNatsServer(name="source", store_dir=workdir / f"src-{name}").start()
    target = LocalNatsServer(name="target", store_dir=workdir / f"dst-{name}").start()
    try:
        src = await connect(source.url)
        dst = await connect(target.url)
        await preload(src, "FLEET", "fleet", count, size)
        with contextlib.ExitStack() as links:
            source_url, target_url = source.url, target.url
            if delay:
                source_url = links.enter_context(proxy_process(source.port, delay))
                target_url = links.enter_context(proxy_process(target.port, delay))
            topic: dict[str, object] = {"topic": "fleet.>", "source_url": source_url, "target_url": target_url,
                                        "name": "bench"}
            if workers > 1:
                topic["workers"] = workers
            with replicator_process(workdir, "copier", topic) as proc:
                began = [0.0]
                seconds = await time_fill(dst, "FLEET", count, lambda: began.__setitem__(0, cpu_seconds(proc.pid)))
                cpu = cpu_seconds(proc.pid) - began[0]
        await src.close()
        await dst.close()
        return Result(name, size, count, seconds, cpu)
    finally:
        source.close()
        target.close()
        discard(workdir)


def discard(workdir: Path) -> None:
    """A finished case's stores go at once: hundreds of MB of dirty pages written back to disk
    while a later case runs would be charged to that case."""
    shutil.rmtree(workdir, ignore_errors=True)


CASES = ("ordered", "scaled", "rtt", "large")


async def run(small: int, large: int, sustained: int, cases: tuple[str, ...] = CASES) -> list[tuple[Result, Result]]:
    out: list[tuple[Result, Result]] = []
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        work = Path(tmp)
        sizes = [(512, small)] + ([(16 * 1024, large)] if "large" in cases else [])
        for size, count in sizes:
            ref = await native_mirror(size, count, work / f"ref{size}")
            out.append((ref, ref))
            if "ordered" in cases or size > 512:
                out.append((await copier("ordered copier", size, count, work / f"o{size}"), ref))
            if "scaled" in cases:
                out.append((await copier("scaled copier (4 workers)", size, count, work / f"s{size}", workers=4),
                            ref))
        if "rtt" in cases:
            # The sustained rate over long links, against the loopback copier on the same count: the
            # first second over a 50 ms link is ramp-up (each of the durable, the first pull, the
            # unchained first copy and the batch's first flow ack costs a round trip).
            loopback = await copier("ordered copier, loopback", 512, sustained, work / "l512")
            out.append((loopback, loopback))
            rtt = await copier("ordered copier, 50 ms RTT proxy", 512, sustained, work / "p512", delay=0.025)
            out.append((rtt, loopback))
    return out


def report(results: list[tuple[Result, Result]]) -> str:
    """Each row's ratio is to the mirror of its size, except the RTT rows': to the loopback copier."""
    rows = []
    for r, ref in results:
        versus = "mirror" if ref.name.startswith("native") else "loopback"
        if r is ref and versus == "loopback":
            versus = "loopback (reference)"
        cpu = f"{r.cpu / r.count * 1e6:.1f}" if r.cpu else "-"
        rows.append((r.name, f"{r.size} B", f"{r.count:,}", f"{r.rate:,.0f}", f"{r.mbps:,.1f}",
                     f"{r.rate / ref.rate:.2f} x {versus}", cpu))
    return table(("copier", "payload", "messages", "msgs/s", "MB/s", "ratio", "copier CPU us/msg"), rows)


def summary(runs: list[list[tuple[Result, Result]]]) -> str:
    """Each row's ratio over all runs: the median and the range (each run against its own references)."""
    ratios: dict[tuple[str, int], list[float]] = {}
    for results in runs:
        for r, ref in results:
            if r is not ref:
                ratios.setdefault((r.name, r.size), []).append(r.rate / ref.rate)
    return table(("copier", "payload", "median ratio", "range", "runs"),
                 [(name, f"{size} B", f"{statistics.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}", str(len(v)))
                  for (name, size), v in ratios.items()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000, help="messages with 512 B payloads")
    parser.add_argument("--large-messages", type=int, default=30_000, help="messages with 16 KB payloads")
    parser.add_argument("--sustained-messages", type=int, default=300_000,
                        help="512 B messages for the 50 ms RTT row and its loopback reference")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs, each with its own references (medians printed)")
    args = parser.parse_args(argv)
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    print(f"Data plane: copier throughput vs NATS's own mirror over a leafnode (same run; {describe()})")
    runs = []
    for _ in range(args.repeat):
        runs.append(asyncio.run(run(args.messages, args.large_messages, args.sustained_messages, cases)))
        print(report(runs[-1]), flush=True)
    if len(runs) > 1:
        print(f"Over {len(runs)} runs (each ratio against the references of its own run):")
        print(summary(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
