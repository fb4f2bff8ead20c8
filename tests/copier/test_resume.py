"""Resuming in a target that others write to: an ordered replicator finds *its own* newest copy
(not another writer's on the same subjects) after kill -9, and takes over a target written by the
previous release (old `Nats-Msg-Id` and provenance formats) with no loss and no duplicate."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from replicator.copier.provenance import PROVENANCE, parse_provenance
from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    spawn,
    stop,
    topic_config,
    write_config,
)
from tests.copier.test_fan_in import writer_of
from tests.support.faults import ContinuousPublisher, compare, read_stream, wait_count


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_resume_finds_its_own_copies_among_other_writers_after_kill_9(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
    target_nc: Client,
) -> None:
    """Another publisher writes the same subjects of the target the whole time (and thousands of
    messages while the replicator is down), so the newest message is never the replicator's: each
    restart must search back for its own newest copy."""
    await make_stream(source_nc)
    await make_stream(target_nc)
    config = write_config(tmp_path / "sr.yaml", topic_config(source_server.url, target_server.url,
                                                             name="city1", max_in_flight=500))
    source = ContinuousPublisher(source_nc, rate=400).start()
    other = ContinuousPublisher(target_nc, rate=1500).start()
    rng = random.Random(11)
    log = tmp_path / "worker.log"
    try:
        for _ in range(3):
            proc = spawn(config, log_path=log)
            await asyncio.sleep(rng.uniform(1.0, 2.0))
            stop(proc, kill=True)
            await asyncio.sleep(1.0)  # the other writer goes on: ~1500 messages after our newest copy
        proc = spawn(config, log_path=log)
        await source.stop()
        await other.stop()
        want = (await source_nc.jetstream().stream_info("FLEET")).state.messages
        writer = await writer_of(source_nc, "city1")
        deadline = time.monotonic() + 60
        mine: list[object] = []
        while time.monotonic() < deadline:
            mine = [m for m in await read_stream(target_nc, "FLEET") if m.writer == writer]
            if len(mine) >= want:
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)
    finally:
        code = stop(proc)
    target = await read_stream(target_nc, "FLEET")
    outcome = compare("resume among other writers", await read_stream(source_nc, "FLEET"), target,
                      recover_s=None, writer=writer, faults=3)
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), (
        f"{outcome}\n{log.read_text()[-3000:]}")
    assert len(target) > want + 4000, "the other writer was not writing in between"
    assert code == 0


def _old_release_copy(seq: int, subject: str, data: bytes, ts_ms: int) -> tuple[str, bytes, dict[str, str]]:
    """A copy exactly as the previous release wrote it."""
    headers = {PROVENANCE: f"FLEET {seq} sr {ts_ms}", "Nats-Msg-Id": f"FLEET:{seq}"}
    if seq > 1:
        headers["Nats-Expected-Last-Msg-Id"] = f"FLEET:{seq - 1}"
    return subject, data, headers


@pytest.mark.timeout(90)
@pytest.mark.parametrize("state", ["stopped cleanly", "crashed", "crashed, another writer since"])
async def test_upgrade_from_the_previous_release_loses_and_duplicates_nothing(
    state: str, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client,
    target_nc: Client,
) -> None:
    """The previous release copied 1..2000 (old formats) and acknowledged 1..2000 (stopped cleanly)
    or only 1..1500 with 1501..2200 delivered (crashed, possibly with another writer's messages
    after its last copy); the new release copies 2001..3000 once each, in order."""
    total, landed = 3000, 2000
    floor, delivered = (landed, landed) if state == "stopped cleanly" else (1500, 2200)
    await make_stream(source_nc)
    await make_stream(target_nc)
    await publish_many(source_nc, total)
    js = source_nc.jetstream()
    await js.add_consumer("FLEET", ConsumerConfig(durable_name="sr", ack_policy=AckPolicy.ALL,
                                                  deliver_policy=DeliverPolicy.ALL, filter_subject="fleet.>",
                                                  max_ack_pending=4000))
    psub = await js.pull_subscribe_bind("sr", "FLEET")
    got: list[Any] = []
    while len(got) < delivered:
        got += await psub.fetch(min(500, delivered - len(got)), timeout=5)
    await got[floor - 1].ack_sync()  # AckAll up to the floor
    await psub.unsubscribe()
    tjs = target_nc.jetstream()
    for m in got[:landed]:
        subject, data, headers = _old_release_copy(m.metadata.sequence.stream, m.subject, m.data,
                                                   int(m.metadata.timestamp.timestamp() * 1000))
        await tjs.publish(subject, data, headers=headers)
    if state.endswith("another writer since"):
        await publish_many(target_nc, 300, start=90_000)
    others = 300 if state.endswith("another writer since") else 0
    async with InProcess(profile_for(topic_config(source_server.url, target_server.url))):
        assert await wait_count(target_nc, "FLEET", total + others, 40) is not None
        await asyncio.sleep(1.0)
    target = [m for m in await read_stream(target_nc, "FLEET") if PROVENANCE in m.headers]
    outcome = compare(f"upgrade ({state})", await read_stream(source_nc, "FLEET"), target, recover_s=None)
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
    formats = [parse_provenance(m.headers[PROVENANCE]) for m in target]
    assert all(p is not None and p.legacy == (p.seq <= landed) for p in formats)
