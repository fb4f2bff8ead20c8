"""Cold start of a sampled fleet on shared KV state: every sender new, two pods, measured in one run.

Run: `python -m bench.cold_start [--senders 100000] [--rounds 3]`. The source holds one message
from each of `--senders` new senders. Two `stream-replicator` processes (pods) of two scaled
workers each share one durable and, sampled, one KV bucket of limiter state, so every message is a
first sighting that one of them must claim in the bucket before copying it; the elected pod
publishes a `new` advisory for each. The reference is the same two pods copying the same stream
unsampled. Printed: messages consumed per second (first acknowledgement to last), the sampled
rate as a ratio to the unsampled one of the same round, how long after the last copy the last
`new` advisory was published, and the CPU the two pods used per sender from the first
acknowledgement to the end (the last copy, or the last advisory), and the two servers' over the
same time: CPU moves less with the machine's load than a rate does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from bench.common import command_process, connect, cpu_seconds, table, time_progress
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.compiled import describe

PODS, WORKERS = 2, 2


@dataclass
class Case:
    rate: float  # source messages consumed per second
    advisory_lag: float | None = None  # seconds from the last copy to the last `new` advisory
    cpu_us: float = 0.0  # the pods' CPU per sender, microseconds, from the first acknowledgement to the end
    server_cpu_us: float = 0.0  # the two servers' CPU per sender over the same time


async def preload_new_senders(nc: Client, senders: int) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="FLEET", subjects=["fleet.>"]))
    futures = []
    for i in range(senders):
        body = json.dumps({"sender": f"node{i:07d}.example.net", "facts": "x" * 200}).encode()
        futures.append(await js.publish_async("fleet.registration", body))
        if len(futures) >= 4000:
            await asyncio.gather(*futures)
            futures.clear()
    await asyncio.gather(*futures)


@contextlib.contextmanager
def pods(work: Path, name: str, topic: dict[str, object]) -> Iterator[list[subprocess.Popen[bytes]]]:
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"topics": {"bench": topic}}))
    with contextlib.ExitStack() as running:
        yield [running.enter_context(command_process(["--config", str(config), "--topic", "bench",
                                                      "--instance", f"pod{i}"])) for i in range(PODS)]


async def one_case(source: LocalNatsServer, src: Client, senders: int, name: str, sampled: bool,
                   work: Path) -> Case:
    """Both pods over the whole preloaded stream into a fresh target, on their own durable (and bucket)."""
    target = LocalNatsServer(name="target", store_dir=work / f"t-{name}").start()
    try:
        dst = await connect(target.url)
        advised: list[float] = []

        async def on_advisory(msg: Msg) -> None:
            if b'"new"' in msg.data:
                advised.append(time.monotonic())

        await dst.jetstream().add_stream(StreamConfig(name="ADVISORIES", subjects=["sr.adv.>"]))
        await dst.subscribe(f"sr.adv.{name}", cb=on_advisory)
        topic: dict[str, object] = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url,
                                    "workers": WORKERS, "queue_group": name}
        if sampled:
            topic.update({"inspect": "sender", "age": "1h", "limiter_state": "kv",
                          "advisory": {"target": f"sr.adv.{name}", "age": "30m"}})
        js = src.jetstream()

        async def acked() -> int:
            info = await js.consumer_info("FLEET", name)
            return info.ack_floor.stream_seq if info.ack_floor else 0

        with pods(work, name, topic) as procs:
            cpu_at_first: list[float] = []

            def pods_cpu() -> float:
                return sum(cpu_seconds(proc.pid) for proc in procs)

            def servers_cpu() -> float:
                return sum(cpu_seconds(server.process.pid) for server in (source, target) if server.process)

            seconds = await time_progress(acked, senders, on_first=lambda: cpu_at_first.extend(
                (pods_cpu(), servers_cpu())))
            last_copy = time.monotonic()
            lag = None
            if sampled:
                async def all_advised() -> int:
                    return len(advised)

                with contextlib.suppress(TimeoutError):
                    await time_progress(all_advised, senders, timeout=120)
                lag = advised[-1] - last_copy if len(advised) >= senders else None
            cpu_us = (pods_cpu() - cpu_at_first[0]) / senders * 1e6
            server_cpu_us = (servers_cpu() - cpu_at_first[1]) / senders * 1e6
        await dst.close()
        return Case(senders / seconds, lag, cpu_us, server_cpu_us)
    finally:
        target.close()


async def run(senders: int, rounds: int) -> list[tuple[Case, Case]]:
    with tempfile.TemporaryDirectory(prefix="sr-bench-cold-") as tmp:
        work = Path(tmp)
        source = LocalNatsServer(name="source", store_dir=work / "source").start()
        try:
            src = await connect(source.url)
            await preload_new_senders(src, senders)
            pairs = []
            for r in range(rounds):
                plain = await one_case(source, src, senders, f"plain{r}", False, work)
                sampled = await one_case(source, src, senders, f"cold{r}", True, work)
                pairs.append((plain, sampled))
                print(f"round {r + 1}: unsampled {plain.rate:,.0f} msgs/s, sampled cold start {sampled.rate:,.0f} "
                      f"msgs/s ({sampled.rate / plain.rate:.2f}x), last `new` advisory "
                      f"{'never' if sampled.advisory_lag is None else f'{sampled.advisory_lag:.1f} s'} after the "
                      f"last copy; CPU a sender, pods {plain.cpu_us:.0f} us unsampled, {sampled.cpu_us:.0f} us "
                      f"sampled, servers {plain.server_cpu_us:.0f} and {sampled.server_cpu_us:.0f} us; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
            await src.close()
            return pairs
        finally:
            source.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--senders", type=int, default=100_000, help="new senders, one message each")
    parser.add_argument("--rounds", type=int, default=3, help="alternating unsampled/sampled pairs")
    args = parser.parse_args(argv)
    print(f"Cold start: {args.senders:,} new senders through {PODS} pods x {WORKERS} scaled workers on KV state, "
          f"against the same pods unsampled ({describe()})")
    pairs = asyncio.run(run(args.senders, args.rounds))
    ratios = [s.rate / p.rate for p, s in pairs]
    lags = [s.advisory_lag for _p, s in pairs if s.advisory_lag is not None]
    print(table(("case", "msgs/s (median)", "x unsampled (median)", "range", "last `new` advisory after last copy",
                 "pods' CPU a sender (median)"), [
        ("unsampled (reference)", f"{statistics.median(p.rate for p, _s in pairs):,.0f}", "1.00", "-", "-",
         f"{statistics.median(p.cpu_us for p, _s in pairs):.0f} us"),
        ("sampled, every sender new (KV claims)", f"{statistics.median(s.rate for _p, s in pairs):,.0f}",
         f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}-{max(ratios):.2f}",
         f"{statistics.median(lags):.1f} s (max {max(lags):.1f})" if lags else "not all published",
         f"{statistics.median(s.cpu_us for _p, s in pairs):.0f} us"),
    ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
