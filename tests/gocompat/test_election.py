"""`leader_election_name`: replicas of one Go-format file elect one copier per stream in the Go
tool's bucket (`CHORIA_LEADER_ELECTION` on the source, key `SR_<name>_<stream>`, its TTL) and one
heartbeat publisher (key `SR_<replicator>_HB`); when the leader stops, the other takes over and
the target still holds every source message once, in order."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.js.api import StreamConfig

from replicator.copier.provenance import CHORIA_SOURCE
from replicator.service.process import ReplicatorProcess
from tests.gocompat.conftest import Rig

pytestmark = pytest.mark.timeout(90)


def copying(process: ReplicatorProcess) -> bool:
    plane = process.replicators[0].sampling
    return plane is not None and plane.election is not None and plane.election.is_leader


async def test_leader_election_by_name_with_heartbeats(rig: Rig) -> None:
    src = rig.name("ELECT")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    await rig.sjs.add_stream(StreamConfig(name=f"{src}_HB", subjects=[f"{root}hb.>"]))
    with contextlib.suppress(Exception):  # as the Go docs ask: nats kv add CHORIA_LEADER_ELECTION --ttl 5s
        await rig.sjs.create_key_value(bucket="CHORIA_LEADER_ELECTION", ttl=5, history=1)
    ttl = (await rig.sjs.stream_info("KV_CHORIA_LEADER_ELECTION")).config.max_age
    config = rig.config(rig.stream(src, leader_election_name="replica"), name=f"SITE{src}",
                        heartbeats={"url": rig.sites.source.url, "interval": "200ms", "leader_election": True,
                                    "subjects": [{"subject": f"{root}hb.beat"}]})
    for i in range(100):
        await rig.sjs.publish(f"{root}.n{i % 5}", str(i).encode())
    async with rig.replicating(config) as first, rig.replicating(config) as second:
        assert await rig.wait_count(src, 100) == 100
        leaders = [p for p in (first, second) if copying(p)]
        assert len(leaders) == 1
        leader, standby = leaders[0], (second if leaders[0] is first else first)
        assert leader.replicators[0].sampling.election.key == f"SR_SITE{src}_{src}"  # type: ignore[union-attr]
        assert leader.replicators[0].sampling.election.ttl == ttl  # type: ignore[union-attr]
        beats = [p.heartbeats for p in (first, second)]
        for _ in range(100):  # heartbeats: one publisher, whichever process won that election
            if sorted(hb.paused for hb in beats) == [False, True]:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.1)
        assert sorted(hb.paused for hb in beats) == [False, True]  # type: ignore[union-attr]
        publisher = next(hb for hb in beats if not hb.paused)  # type: ignore[union-attr]
        assert publisher.election.key == f"SR_SITE{src}_HB"  # type: ignore[union-attr]
        assert await rig.wait_count(f"{src}_HB", 2, nc=rig.source) >= 2

        leader.stop()  # the leader goes away (it releases the key): the standby takes over
        for i in range(100, 150):
            await rig.sjs.publish(f"{root}.n{i % 5}", str(i).encode())
        assert await rig.wait_count(src, 150, within=30) == 150
        assert copying(standby)
    copied = [int(m.headers[CHORIA_SOURCE].split()[1]) for m in await rig.read(src)]
    print(f"election: {len(copied)} copies of 150 messages across a leader change")
    assert copied == list(range(1, 151))
