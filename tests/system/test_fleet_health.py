"""The fleet-health job late, then run: a replicator with sampling, advisories and fleet health (a
run every 5 minutes). Until a run comes, FleetHealthNotRun fires; the driver run as the
ScheduledSparkApplication says (spark.py) aggregates the advisories into the summary the operator
reads, the alert resolves, the resource's status.fleet and the operator's fleet series agree, and
every fleet panel of the dashboard returns a series."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system import seams
from tests.support.system.installed import installed, monitoring_values
from tests.support.system.scenario import NS, add_stream, replication, trickle
from tests.support.system.spark import SparkRuns

# A run every 5 minutes, late after 0.6 of an interval (3 minutes). A run's summary stamps the time it
# started (status.fleet.lastRun), so the threshold must exceed a run's length: one to two minutes for
# a local Spark driver on two busy cores.
VALUES = monitoring_values(fleetHealthIntervals=0.6)


@pytest.mark.timeout(600)
async def test_the_fleet_health_job_late_fires_and_a_run_resolves_it(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "REGISTRATION", ["choria.registration.>"])
    await add_stream(target_server.url, "REPLICATOR_ADVISORIES", ["replicator.advisories.>"])
    resource = replication(
        "registrations", source_server.url, target_server.url, "REGISTRATION", "choria.registration.>",
        mode="ordered",
        sampling={"inspectHeader": "Choria-Sender", "age": "1h"},
        advisory={"subject": "replicator.advisories.registrations", "cluster": "target", "age": "1h"},
        fleetHealth={"schedule": "*/5 * * * *", "stream": "REPLICATOR_ADVISORIES", "kvBucket": "FLEET_HEALTH",
                     "output": str(tmp_path / "fleet-tables")},
    )
    nodes = [f"choria.registration.node{i}.dc1" for i in range(4)]
    async with installed(tmp_path / "system", VALUES, [NS]) as system, trickle(source_server.url, nodes, 10):
        await system.cluster.apply(resource)
        await system.until(lambda: seams.alert_state(system, "StreamReplicatorFleetHealthNotRun", namespace=NS)
                           == "firing", 240, "FleetHealthNotRun firing while no run comes")

        done = await SparkRuns(system.cluster, tmp_path / "spark").run(NS, "registrations-fleet-health")
        assert done.returncode == 0, done.stderr[-4000:]
        await system.until(lambda: ((system.resource(NS, "registrations") or {}).get("status") or {}).get("fleet"),
                           60, "status.fleet from the run's summary")
        await system.until(lambda: seams.alert_state(system, "StreamReplicatorFleetHealthNotRun", namespace=NS)
                           == "inactive", 60, "FleetHealthNotRun resolved by the run")
        fleet = system.resource(NS, "registrations")["status"]["fleet"]  # type: ignore[index]
        (healthy,) = system.prometheus.query(f'stream_replicator_fleet_health_nodes{{namespace="{NS}", '
                                             f'streamreplication="registrations", state="healthy"}}')
        assert float(healthy["value"][1]) == fleet["healthy"] == len(nodes)
        empty_fleet = [p for p in seams.empty_panels(system) if "panel Fleet health/" in p]
        assert empty_fleet == []
