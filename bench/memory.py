"""Resident memory of worker processes: an idle single-replication worker, and a pool of many
replications in one process, each with a little traffic, measured in one run.

Run: `python -m bench.memory [--pool 100]`. The single worker is the operator's command line
(`stream-replicator --config F --topic T`); the pool is `stream-replicator replicate --config F`
over a file of `--pool` profiles, each its own stream. Every pool figure is printed as a ratio to
the single worker of the same run. Resident memory (VmRSS) counts the shared libraries' pages a
process touched, as a container's memory accounting does; USS (private pages) is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml
from nats.aio.client import Client
from nats.js.api import StreamConfig

from bench.common import command_process, connect, table
from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.service.compiled import describe

IDLE_SETTLE = 3.0  # seconds a worker idles after it is ready (and its traffic copied) before it is read
MB = 1024 * 1024


@dataclass
class Footprint:
    label: str
    replications: int
    rss: int  # bytes
    uss: int  # bytes: pages of this process alone

    @property
    def per_replication(self) -> float:
        return self.rss / self.replications


def footprint(pid: int) -> tuple[int, int]:
    """(RSS, USS) of a process, in bytes, from /proc."""
    rss = uss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Rss":
            rss = int(rest.split()[0]) * 1024
        elif key in ("Private_Clean", "Private_Dirty"):
            uss += int(rest.split()[0]) * 1024
    return rss, uss


def topic(i: int, source: str, target: str, port: int) -> dict[str, object]:
    return {"topic": f"pool{i}.>", "source_url": source, "target_url": target, "name": f"pool{i}", "monitor": port}


def readyz(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except OSError:
        return None


async def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with status {proc.returncode}")
        state = readyz(port)
        if state is not None and state.get("ready"):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the worker was not ready in {timeout:.0f} s")


async def make_streams(src: Client, count: int) -> None:
    js = src.jetstream()
    for i in range(count):
        await js.add_stream(StreamConfig(name=f"POOL{i}", subjects=[f"pool{i}.>"]))


async def traffic(src: Client, dst: Client, count: int, per_replication: int) -> None:
    """`per_replication` small messages into each stream, then wait until every copy landed."""
    js = src.jetstream()
    for n in range(per_replication):
        await asyncio.gather(*[js.publish(f"pool{i}.m", json.dumps({"n": n, "i": i}).encode())
                               for i in range(count)])
    target = dst.jetstream()
    deadline = time.monotonic() + 120
    for i in range(count):
        while (await target.stream_info(f"POOL{i}")).state.messages < per_replication:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream POOL{i} was not copied")
            await asyncio.sleep(0.1)


async def measure(work: Path, label: str, count: int, per_replication: int, source: LocalNatsServer,
                  target: LocalNatsServer, src: Client, dst: Client) -> Footprint:
    port = free_port()
    config = work / f"{label}.yaml"
    config.write_text(yaml.safe_dump({"topics": {f"p{i}": topic(i, source.url, target.url, port)
                                                 for i in range(count)}}))
    args = ["--config", str(config), "--topic", "p0"] if count == 1 else ["replicate", "--config", str(config)]
    with command_process(args) as proc:
        await wait_ready(port, proc)
        if per_replication:
            await traffic(src, dst, count, per_replication)
        await asyncio.sleep(IDLE_SETTLE)
        rss, uss = footprint(proc.pid)
    return Footprint(label, count, rss, uss)


async def run(pool: int, per_replication: int) -> tuple[Footprint, Footprint]:
    with tempfile.TemporaryDirectory(prefix="sr-bench-memory-") as tmp:
        work = Path(tmp)
        source = LocalNatsServer(name="source", store_dir=work / "source").start()
        target = LocalNatsServer(name="target", store_dir=work / "target").start()
        try:
            src, dst = await connect(source.url), await connect(target.url)
            await make_streams(src, pool)
            single = await measure(work, "single", 1, 0, source, target, src, dst)
            pooled = await measure(work, "pool", pool, per_replication, source, target, src, dst)
            await src.close()
            await dst.close()
            return single, pooled
        finally:
            source.close()
            target.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", type=int, default=100, help="replications in the pooled process")
    parser.add_argument("--messages", type=int, default=20, help="messages copied per pooled replication")
    args = parser.parse_args(argv)
    single, pooled = asyncio.run(run(args.pool, args.messages))
    print(f"Worker memory: an idle single-replication worker, and {args.pool} replications in one process "
          f"({args.messages} messages each), same run ({describe()})")
    print(table(("process", "replications", "RSS MB", "USS MB", "RSS MB per replication", "x single worker"), [
        ("single-replication worker (idle)", "1", f"{single.rss / MB:.1f}", f"{single.uss / MB:.1f}",
         f"{single.rss / MB:.1f}", "1.00"),
        (f"pool of {pooled.replications}", str(pooled.replications), f"{pooled.rss / MB:.1f}",
         f"{pooled.uss / MB:.1f}", f"{pooled.per_replication / MB:.2f}",
         f"{pooled.rss / single.rss:.2f} in all, {pooled.per_replication / single.rss:.3f} per replication"),
    ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
