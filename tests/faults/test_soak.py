"""Soak: a minute per write path of continuous publishing with a random fault every few seconds.

The faults are drawn from the kinds the single scenarios exercise one at a time (kill -9 of the
worker, link cuts, server restarts, SIGTERM or SIGKILL), so they overlap with recoveries still
in progress, which the single scenarios never do. The seed is printed in the results table; set
SR_SOAK_SEED to replay a run, SR_SOAK_SECONDS to soak longer.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import statistics
import time

import pytest

from tests.copier.helpers import WRITE_PATHS
from tests.faults.rig import STREAM, Rig
from tests.support.faults import wait_count, wait_metric

SOAK_SECONDS = float(os.environ.get("SR_SOAK_SECONDS", "60"))  # per write path
KINDS = ("kill -9 worker", "cut source link", "cut target link", "restart source", "restart target")


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 150)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_soak_random_faults_under_load(rig: Rig, path: str) -> None:
    seed = int(os.environ.get("SR_SOAK_SEED", str(random.randrange(1_000_000))))
    rng = random.Random(seed)
    for proxy in (rig.source_proxy, rig.target_proxy):
        proxy.set_delay(0.002)
    await rig.stream()
    await rig.target_for(path)
    rig.write_config()
    proc = rig.spawn()
    rig.publish(rate=300)
    assert await wait_count(rig.target_nc, STREAM, 100, 30) is not None, rig.log_tail()
    assert await wait_metric(rig.monitor, "stream_replicator_write_path", 1.0, 10, path=path), rig.log_tail()
    began = time.monotonic()
    end = began + SOAK_SECONDS
    counts: collections.Counter[str] = collections.Counter()
    recoveries: list[float] = []
    watchers: list[asyncio.Task[None]] = []

    async def watch(since: float) -> None:
        """Time from a fault's end until everything published before it is on the target."""
        took = await rig.time_to_catch_up(since, within=60)
        if took is not None:
            recoveries.append(took)

    while time.monotonic() < end - 8:
        await asyncio.sleep(rng.uniform(2.0, 5.0))
        kind = rng.choice(KINDS)
        counts[kind] += 1
        if kind == "kill -9 worker":
            rig.kill(proc)
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            proc = rig.spawn()
        elif kind.startswith("cut"):
            proxy = rig.source_proxy if "source" in kind else rig.target_proxy
            proxy.cut()
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            proxy.restore()
        else:
            server = rig.source if "source" in kind else rig.target
            await rig.stop_server(server, kill=rng.random() < 0.5)
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            await rig.start_server(server)
        watchers.append(asyncio.ensure_future(watch(time.monotonic())))
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    await asyncio.gather(*watchers)
    mix = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
    median = statistics.median(recoveries) if recoveries else float("nan")
    await rig.finish(
        f"soak {SOAK_SECONDS:.0f} s, random faults ({path} path)", recover_s=max(recoveries) if recoveries else None,
        faults=sum(counts.values()),
        notes=f"seed {seed}; {mix}; recover: worst of {len(recoveries)} (median {median:.1f} s)",
    )
    assert len(recoveries) == sum(counts.values()), "some fault was never recovered from within 60 s"
