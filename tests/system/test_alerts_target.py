"""Alerts that fire when the target fails, on the replicator engine, each asserted through
Prometheus's alerts API, and resolving once the fault is gone: a worker that cannot reach its target
(NotReady), the target down while messages keep coming (LagGrowing, Stuck) and a poison message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import nats

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system import seams
from tests.support.system.installed import System, installed, monitoring_values
from tests.support.system.scenario import NS, add_stream, replication, trickle

NAME = "replication_cmdb"  # the worker's `name` label: <namespace>_<resource>
SUBJECTS = ("acme.cmdb.a", "acme.cmdb.b")  # what the trickle publishes to


async def _state(system: System, alert: str, state: str, within: float) -> None:
    await system.until(lambda: seams.alert_state(system, alert, namespace=NS) == state, within,
                       f"{alert} {state}")


async def _ready(system: System) -> None:
    await system.until(lambda: ((system.resource(NS, "cmdb") or {}).get("status") or {}).get("readyReplicas") == 1,
                       90, "cmdb Ready")
    await system.until(lambda: len([t for t in system.prometheus.targets() if t["health"] == "up"]) == 2, 60,
                       "the worker scraped")


@contextlib.asynccontextmanager
async def _replicating(tmp_path: Path, source: str, target: str, subjects: tuple[str, ...] = SUBJECTS,
                       per_second: float = 20) -> AsyncIterator[System]:
    """The chart installed with monitoring, `cmdb` copying CMDB in ordered mode and Ready, while a
    trickle publishes to `subjects`."""
    async with installed(tmp_path, monitoring_values(), [NS]) as system, \
            trickle(source, list(subjects), per_second=per_second):
        await system.cluster.apply(replication("cmdb", source, target, "CMDB", "acme.cmdb.>", mode="ordered"))
        await _ready(system)
        yield system


async def test_a_worker_that_cannot_reach_its_target_fires_not_ready_and_it_resolves(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    async with _replicating(tmp_path, source_server.url, target_server.url) as system:
        await asyncio.sleep(5)
        assert seams.active_alerts(system) == []

        await asyncio.to_thread(target_server.stop)
        await _state(system, "StreamReplicatorNotReady", "firing", 60)
        firing = [a["labels"] for a in seams.active_alerts(system) if a["labels"]["alertname"].endswith("NotReady")]
        # Both halves of the rule: the operator's replica count and the worker's own readiness.
        assert {"streamreplication": "cmdb"}.items() <= next(a for a in firing if "streamreplication" in a).items()
        assert any(a.get("name") == NAME and a.get("pod", "").startswith("cmdb-") for a in firing)
        assert ((system.resource(NS, "cmdb") or {}).get("status") or {}).get("readyReplicas") == 0

        await asyncio.to_thread(target_server.start)
        await _state(system, "StreamReplicatorNotReady", "inactive", 90)
        await system.until(lambda: seams.active_alerts(system) == [], 60, "no alert left")


async def test_target_down_fires_lag_growing_and_stuck(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    async with _replicating(tmp_path, source_server.url, target_server.url) as system:
        await asyncio.to_thread(target_server.stop)
        # 20 messages a second: past lagMinMessages (20) at once, growing over the 20 s window.
        for alert in ("StreamReplicatorLagGrowing", "StreamReplicatorStuck"):
            await _state(system, alert, "firing", 45)
        await asyncio.to_thread(target_server.start)
        for alert in ("StreamReplicatorLagGrowing", "StreamReplicatorStuck"):
            await _state(system, alert, "inactive", 90)


async def test_a_poison_message_fires_and_resolves(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    # The target refuses messages over 1 KiB for good (JetStream error 10054): poison.
    await add_stream(target_server.url, "CMDB_COPY", ["acme.cmdb.>"], max_msg_size=1024)
    async with _replicating(tmp_path, source_server.url, target_server.url, ("acme.cmdb.a",), 5) as system:
        await asyncio.sleep(5)
        assert seams.active_alerts(system) == []

        nc = await nats.connect(source_server.url)
        try:
            await nc.jetstream().publish("acme.cmdb.big", b"x" * 4096)
        finally:
            await nc.close()
        await _state(system, "StreamReplicatorPoisonMessages", "firing", 90)
        (alert,) = [a for a in seams.active_alerts(system) if a["labels"]["alertname"].endswith("PoisonMessages")]
        assert alert["labels"]["name"] == NAME
        # Copying goes on past it; the alert resolves once the window holds no poison.
        await _state(system, "StreamReplicatorPoisonMessages", "inactive", 90)
        assert seams.active_alerts(system) == []
