"""Blind spots: an outage with a backlog yields no false `timeout`, still catches the nodes that
really stopped, and is itself advised.

Senders publish steadily through a city stream; the replicator's link to the target is cut for
longer than the advisory age while they go on, and some of them stop for good when the cut begins.
Read through the advisory stream on the target: `timeout` for exactly the stopped ones (judged on
the stream's clock as the backlog is read), none for the others however long the outage, and one
`blind_spot` advisory spanning the outage. The full-size run (1,000,000 messages, 100,000 senders)
is `bench/blind_spots.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import StreamConfig

from tests.copier.helpers import make_target
from tests.faults.rig import Rig
from tests.support.faults import read_stream

pytestmark = pytest.mark.slow

SENDERS, SILENT = 100, 10
ADVISORY_AGE = 3.0  # a sender silent this long (in stream time) is advised `timeout`
OUTAGE = 3 * ADVISORY_AGE


async def fleet(rig: Rig, stop: asyncio.Event, silent: asyncio.Event) -> None:
    """Every sender publishes every 0.25 s; the first SILENT stop once `silent` is set."""
    js = rig.source_nc.jetstream()
    while not stop.is_set():
        senders = range(SILENT if silent.is_set() else 0, SENDERS)
        await asyncio.gather(*[await js.publish_async(f"fleet.node{i}", b"{}") for i in senders])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def advisories(rig: Rig) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in await read_stream(rig.target_nc, "ADV")]


@pytest.mark.timeout(180)
async def test_an_outage_with_a_backlog_gives_no_false_timeouts_and_one_blind_spot(rig: Rig) -> None:
    await rig.stream()
    await make_target(rig.target_nc, "batch")
    await rig.target_nc.jetstream().add_stream(StreamConfig(name="ADV", subjects=["adv.>"]))
    rig.write_config(inspect_subject_token=2, age="1h", max_in_flight=50,
                     advisory={"target": "adv.%s", "age": f"{ADVISORY_AGE}s", "reliable": True})
    stop, silent = asyncio.Event(), asyncio.Event()
    publisher = asyncio.create_task(fleet(rig, stop, silent))
    rig.spawn()
    for _ in range(100):
        if sum(a["event"] == "new" for a in await advisories(rig)) >= SENDERS:
            break
        await asyncio.sleep(0.2)
    assert sum(a["event"] == "new" for a in await advisories(rig)) == SENDERS

    cut = time.time()
    rig.target_proxy.cut()
    silent.set()
    await asyncio.sleep(OUTAGE)
    rig.target_proxy.restore()
    restored = time.time()
    await asyncio.sleep(2 * ADVISORY_AGE)  # the backlog is read; the stopped ones' silence passes the age
    stop.set()
    await publisher

    found: list[dict[str, Any]] = []
    for _ in range(60):
        found = await advisories(rig)
        timeouts = {a["value"] for a in found if a["event"] == "timeout"}
        if len(timeouts) >= SILENT and any(a["event"] == "blind_spot" for a in found):
            break
        await asyncio.sleep(0.5)
    timeouts = {a["value"] for a in found if a["event"] == "timeout"}
    stopped = {f"node{i}" for i in range(SILENT)}
    assert timeouts - stopped == set(), "false timeouts for nodes that kept publishing"
    assert timeouts == stopped, "a node that really stopped was not caught"
    spots = [a for a in found if a["event"] == "blind_spot"]
    assert len(spots) == 1, spots
    spot = spots[0]
    # From the newest message it read (it reads on, sampling, until the consumer's unacknowledged
    # limit stops it: skips are acknowledged with the copy ahead of them) to when it caught up.
    assert cut - 1 <= spot["from"] < restored <= spot["until"], (spot, cut, restored)
    assert spot["until"] - spot["from"] > ADVISORY_AGE


@pytest.mark.timeout(600)
async def test_a_replicator_outage_with_a_backlog_bounded_version_of_the_bench(tmp_path: Path) -> None:
    """`bench/blind_spots.py` at a tenth of a tenth: the replicator itself down while 2,000 senders
    publish a backlog of 20,000 messages; 50 of them never speak again. Its state in a file, so the
    restarted replicator knows every sender."""
    from bench.blind_spots import scenario

    # an age of 8 s: keep-alive rounds every 2.7 s, which a loaded 2-core machine keeps up with
    r = await scenario(tmp_path, messages=20_000, senders=2_000, silent=50, advisory_age=8.0)
    assert r["false_timeouts"] == 0, r
    assert r["caught"] == 50, r
    assert r["blind_spots"] >= 1, r
    assert (r["unknown"], r["fleet_timeout"]) == (50, 0), r
