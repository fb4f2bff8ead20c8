"""Sampling cost and benefit against the same copier without sampling, measured in one run.

(a) worst case: every message is a first-seen sender, so everything is forwarded;
(b) fleet case: S senders each seen 12 times within one `age` (5 minutes against 1 hour), so 11 of
    12 messages are skipped. Rates are source messages consumed per second (acked), because a
    skipped message never reaches the target.
Memory per tracked sender is measured by `python -m bench.limiter_memory`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import StreamConfig

from bench.common import connect, replicator_process, table, time_progress
from replicator.local_nats import LocalNatsServer


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


async def one(label: str, senders: int, repeats: int, sampling: bool, work: Path) -> tuple[str, int, float]:
    source = LocalNatsServer(name="source", store_dir=work / f"s-{label}").start()
    target = LocalNatsServer(name="target", store_dir=work / f"t-{label}").start()
    try:
        src = await connect(source.url)
        total = await preload_senders(src, senders, repeats)
        topic = {"topic": "fleet.>", "source_url": source.url, "target_url": target.url, "name": "bench"}
        if sampling:
            topic.update({"inspect": "sender", "age": "1h"})
        with replicator_process(work, label.split(" ")[0].strip("()"), topic):
            seconds = await time_consumed(src, "bench", total)
        await src.close()
        return label, total, seconds
    finally:
        source.close()
        target.close()


async def run(senders: int, worst: int) -> list[tuple[str, int, float, float]]:
    with tempfile.TemporaryDirectory(prefix="sr-bench-sampling-") as tmp:
        work = Path(tmp)
        results = []
        base_worst = await one("unsampled (distinct senders)", worst, 1, False, work)
        results.append((*base_worst, 1.0))
        w = await one("(a) worst case: every sender new", worst, 1, True, work)
        results.append((*w, (w[1] / w[2]) / (base_worst[1] / base_worst[2])))
        base_fleet = await one("unsampled (fleet traffic)", senders, 12, False, work)
        results.append((*base_fleet, 1.0))
        f = await one("(b) fleet case: 11 of 12 skipped", senders, 12, True, work)
        results.append((*f, (f[1] / f[2]) / (base_fleet[1] / base_fleet[2])))
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--senders", type=int, default=100_000, help="fleet size for the fleet case (x12 messages)")
    parser.add_argument("--worst", type=int, default=200_000, help="messages for the worst case")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.senders, args.worst))
    print("Sampling: source messages consumed per second, vs the same copier unsampled (same run)")
    print(table(("case", "messages", "msgs/s", "x unsampled"),
                [(label, f"{n:,}", f"{n / s:,.0f}", f"{ratio:.2f}") for label, n, s, ratio in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
