"""A healthy install, watched: the chart with monitoring on, the operator it deploys, an ordered
replicator with sampling and advisories and a scaled one with two pods, on real NATS servers.
Prometheus scrapes every worker and the operator, no alert is pending or firing, the rules read only
series and labels that exist, every worker panel of the dashboard returns a series, and the
resources' status agrees with the metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system import seams
from tests.support.system.installed import installed, monitoring_values
from tests.support.system.scenario import NS, add_stream, replication, trickle

# The rows and series a healthy install without TLS, without a fleet-health run and without a
# native-engine resource has no producer for: certificates (no TLS here), the fleet's summary (no
# Spark run here) and the native engine's series (tests/system/test_native.py runs one).
NO_PRODUCER_ROWS = {"Fleet health", "Native engine"}
NO_PRODUCER_SERIES = {
    "stream_replicator_certificate_remaining_seconds",
    "stream_replicator_fleet_health_last_run_timestamp_seconds",
    "stream_replicator_fleet_health_interval_seconds",
}
NO_PRODUCER_PANELS = {("Readiness and certificates", "Certificates")}


async def test_a_healthy_install_is_watched_end_to_end(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    await add_stream(source_server.url, "TELEMETRY", ["telemetry.>"])
    await add_stream(target_server.url, "ADVISORIES", ["replicator.advisories.>"])
    ordered = replication("cmdb", source_server.url, target_server.url, "CMDB", "acme.cmdb.>", mode="ordered",
                          sampling={"inspectHeader": "Choria-Sender", "age": "1h"},
                          advisory={"subject": "replicator.advisories.cmdb", "cluster": "target", "age": "1h"})
    scaled = replication("telemetry", source_server.url, target_server.url, "TELEMETRY", "telemetry.>",
                         mode="scaled", replicas=2, workersPerPod=2)
    subjects = [f"acme.cmdb.node{i}" for i in range(5)]
    async with installed(tmp_path, monitoring_values(), [NS]) as system, \
            trickle(source_server.url, [*subjects, "telemetry.eu.a", "telemetry.eu.b"]):
        for resource in (ordered, scaled):
            await system.cluster.apply(resource)

        def ready(name: str, pods: int) -> bool:
            status = (system.resource(NS, name) or {}).get("status") or {}
            return status.get("readyReplicas") == pods

        await system.until(lambda: ready("cmdb", 1) and ready("telemetry", 2), 90, "both resources Ready")
        await system.until(lambda: len([t for t in system.prometheus.targets() if t["health"] == "up"]) == 4, 60,
                           "the operator and three worker pods scraped")
        # Two rule evaluations past the longest `for:` of the test values, with every series in.
        await asyncio.sleep(15)

        assert seams.unscraped(system) == []
        assert seams.rule_gaps(system, absent_ok=NO_PRODUCER_SERIES) == []
        empty = [p for p in seams.empty_panels(system, skip_rows=NO_PRODUCER_ROWS)
                 if not any(f"panel {row}/{panel} " in p for row, panel in NO_PRODUCER_PANELS)]
        assert empty == []
        assert seams.active_alerts(system) == []

        # Status and metrics agree: the operator's replica gauges and the workers' own readiness.
        for name, pods in (("cmdb", 1), ("telemetry", 2)):
            status = system.resource(NS, name)["status"]  # type: ignore[index]
            (ready_gauge,) = system.prometheus.query(
                f'stream_replicator_resource_replicas_ready{{namespace="{NS}", streamreplication="{name}"}}')
            assert float(ready_gauge["value"][1]) == status["readyReplicas"] == pods
            workers = system.prometheus.query(f'stream_replicator_ready{{namespace="{NS}", service="{name}-metrics"}}')
            assert {w["metric"]["pod"] for w in workers} == {p.name for p in system.kubelet.pods(NS, name)}
            assert all(w["value"][1] == "1" for w in workers)
