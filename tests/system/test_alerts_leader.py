"""No election leader: an ordered replication with a hot standby (2 pods) whose election lock is
taken and held by a stale holder outside the Deployment (a pod left behind on a partitioned node,
say). Both scraped pods are standbys: LeaderMissing fires. The stale holder gone, its key expires,
a pod wins the lock and the alert resolves."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system import seams
from tests.support.system.installed import installed, monitoring_values
from tests.support.system.scenario import NS, add_stream, replication, trickle

BUCKET = "SR_ELECTION"  # the election's bucket for its default 10 s TTL (sampling/election.py)


async def test_no_election_leader_fires_and_resolves(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    async with installed(tmp_path, monitoring_values(), [NS]) as system, \
            trickle(source_server.url, ["acme.cmdb.a"], per_second=5):
        await system.cluster.apply(replication("cmdb", source_server.url, target_server.url, "CMDB", "acme.cmdb.>",
                                               mode="ordered", replicas=2))

        def leaders() -> list[str]:
            return [r["value"][1] for r in system.prometheus.query(
                f'stream_replicator_leader{{namespace="{NS}", service="cmdb-metrics"}}')]

        await system.until(lambda: sorted(leaders()) == ["0", "1"], 90, "one leader and one standby scraped")
        await asyncio.sleep(5)
        assert seams.active_alerts(system) == []

        nc = await nats.connect(source_server.url)
        kv = await nc.jetstream().key_value(BUCKET)
        (key,) = await kv.keys()
        stale = asyncio.Event()

        async def hold() -> None:
            """Take the lock over the leader's revision and renew it, as a leader would."""
            while not stale.is_set():
                with contextlib.suppress(nats.errors.Error, nats.js.errors.KeyWrongLastSequenceError):
                    entry = await kv.get(key)
                    await kv.update(key, b"stale-pod", last=entry.revision)
                await asyncio.sleep(1)

        holder = asyncio.create_task(hold())
        try:
            await system.until(lambda: seams.alert_state(system, "StreamReplicatorLeaderMissing",
                                                         namespace=NS) == "firing", 60, "LeaderMissing firing")
            assert leaders() == ["0", "0"]
            (alert,) = [a for a in seams.active_alerts(system)
                        if a["labels"]["alertname"] == "StreamReplicatorLeaderMissing"]
            assert alert["labels"]["name"] == "replication_cmdb"
        finally:
            stale.set()
            await holder
            await nc.close()
        await system.until(lambda: seams.alert_state(system, "StreamReplicatorLeaderMissing",
                                                     namespace=NS) == "inactive", 60, "LeaderMissing resolved")
        assert sorted(leaders()) == ["0", "1"]
