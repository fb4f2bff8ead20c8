"""Sampling cost and benefit against the same copier without sampling, measured in one run.

(a) worst case: every message is a first-seen sender, so everything is forwarded;
(b) fleet case: S senders each seen 12 times within one `age` (5 minutes against 1 hour), so 11 of
    12 messages are skipped. Rates are source messages consumed per second (acked), because a
    skipped message never reaches the target. Each case's stream is published once and consumed
    by alternating unsampled and sampled runs (each its own durable and a fresh target); the ratio
    reported is the median of the pairs.
Memory per tracked sender is measured by `python -m bench.limiter_memory`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import StreamConfig

from bench.common import connect, replicator_process, table, time_progress
from replicator.demo.local_nats import LocalNatsServer
from replicator.service.compiled import describe


async def preload_senders(nc: Client, senders: int, repeats: int) -> int:
    """`repeats` rounds over all senders: the order a fleet publishing every 5 minutes produces."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="FLEET", subjects=["fleet.>"]))
    futures = []
    total = 0
    for round_ in range(repeats):
        for i in range(senders):
            body = json.dumps({"sender": f"node{i:07d}.example.net", "round": round_, "facts": "x" * 200}).encode()
            futures.append(await js.publish_async("fleet.registration", body))
            total += 1
            if len(futures) >= 4000:
                await asyncio.gather(*futures)
                futures.clear()
    await asyncio.gather(*futures)
    return total


async def time_consumed(nc: Client, durable: str, total: int) -> float:
    """Seconds from the first acknowledgement to the last on the source consumer."""
    js = nc.jetstream()

    async def acked() -> int:
        info = await js.consumer_info("FLEET", durable)
        return info.ack_floor.stream_seq if info.ack_floor else 0

    return await time_progress(acked, total)


async def timed_run(source: LocalNatsServer, src: Client, total: int, name: str, sampling: bool,
                    work: Path) -> float:
    """One replicator process over the whole preloaded stream into a fresh target; its own durable."""
    target = LocalNatsServer(name="target", store_dir=work / f"t-{name}").start()
    try:
        topic: dict[str, object] = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url,
                                    "name": name}
        if sampling:
            topic.update({"inspect": "sender", "age": "1h"})
        with replicator_process(work, name, topic):
            return await time_consumed(src, name, total)
    finally:
        target.close()


async def one_case(label: str, slug: str, senders: int, repeats: int, rounds: int,
                   work: Path) -> tuple[str, int, float, float, list[float]]:
    """(label, messages, unsampled msgs/s, sampled msgs/s, each pair's ratio): the stream is published
    once and consumed by `rounds` alternating pairs of runs, so machine noise hits both sides."""
    source = LocalNatsServer(name="source", store_dir=work / f"s-{slug}").start()
    try:
        src = await connect(source.url)
        total = await preload_senders(src, senders, repeats)
        plain, sampled = [], []
        for r in range(rounds):
            plain.append(total / await timed_run(source, src, total, f"{slug}-plain-{r}", False, work))
            sampled.append(total / await timed_run(source, src, total, f"{slug}-sampled-{r}", True, work))
        await src.close()
        ratios = [s / p for s, p in zip(sampled, plain, strict=True)]
        return label, total, statistics.median(plain), statistics.median(sampled), ratios
    finally:
        source.close()


async def run(senders: int, worst: int, rounds: int) -> list[tuple[str, int, float, float, list[float]]]:
    with tempfile.TemporaryDirectory(prefix="sr-bench-sampling-") as tmp:
        work = Path(tmp)
        return [
            await one_case("(a) worst case: every sender new", "worst", worst, 1, rounds, work),
            await one_case("(b) fleet case: 11 of 12 skipped", "fleet", senders, 12, rounds, work),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--senders", type=int, default=100_000, help="fleet size for the fleet case (x12 messages)")
    parser.add_argument("--worst", type=int, default=200_000, help="messages for the worst case")
    parser.add_argument("--rounds", type=int, default=5, help="alternating unsampled/sampled pairs per case")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.senders, args.worst, args.rounds))
    print(f"Sampling: source messages consumed per second, unsampled vs sampled, the same copier on the same "
          f"stream (median of {args.rounds} alternating pairs; {describe()})")
    print(table(("case", "messages", "unsampled msgs/s", "sampled msgs/s", "x unsampled", "pairs (range)"),
                [(label, f"{n:,}", f"{p:,.0f}", f"{s:,.0f}", f"{statistics.median(r):.2f}",
                  f"{min(r):.2f}-{max(r):.2f}") for label, n, p, s, r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
