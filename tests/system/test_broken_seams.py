"""The harness catches broken seams: each is broken on purpose in the objects Prometheus and Grafana
are given (as a changed operator, worker, rule or dashboard would produce them), and the harness's
check names it; restored, the check is clean again. One install serves the four."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system import dashboard, seams
from tests.support.system.installed import DASHBOARD, System, installed, monitoring_values
from tests.support.system.scenario import NS, add_stream, replication, trickle

# Rows with no producer in this install: no fleet-health run, no TLS, no native-engine resource.
NOT_HERE = {"Fleet health", "Readiness and certificates", "Native engine"}
ABSENT_HERE = {
    "stream_replicator_certificate_remaining_seconds",
    "stream_replicator_fleet_health_last_run_timestamp_seconds",
    "stream_replicator_fleet_health_interval_seconds",
}


async def _broken(system: System, tamper: Callable[[dict[str, Any]], None],
                  check: Callable[[], list[str]], seam: str) -> list[str]:
    """Break the seam, wait until the check sees it, restore it, wait until the check is clean."""
    system.tamper = tamper
    await asyncio.to_thread(system.sync_prometheus)
    found = await system.until(lambda: [p for p in check() if seam in p], 30, f"the harness seeing {seam!r}")
    system.tamper = None
    await asyncio.to_thread(system.sync_prometheus)
    await system.until(lambda: not [p for p in check() if seam in p], 30, f"{seam!r} restored")
    return list(found)


async def test_the_harness_names_each_seam_broken_on_purpose(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    async with installed(tmp_path, monitoring_values(), [NS]) as system, \
            trickle(source_server.url, ["acme.cmdb.a", "acme.cmdb.b"]):
        await system.cluster.apply(replication("cmdb", source_server.url, target_server.url, "CMDB", "acme.cmdb.>",
                                               mode="ordered"))
        await system.until(lambda: len([t for t in system.prometheus.targets() if t["health"] == "up"]) == 2, 90,
                           "the operator and the worker scraped")
        await asyncio.sleep(3)

        def rules() -> list[str]:
            return seams.rule_gaps(system, absent_ok=ABSENT_HERE)

        assert seams.unscraped(system) == []
        assert rules() == []

        # 1. A label renamed on the operator's worker metrics Service.
        def rename_service_label(obj: dict[str, Any]) -> None:
            if obj["kind"] == "Service" and obj["metadata"]["name"] == "cmdb-metrics":
                obj["metadata"]["labels"]["app.kubernetes.io/component"] = "worker-metrics"

        (found,) = await _broken(system, rename_service_label, lambda: seams.unscraped(system),
                                 "no ServiceMonitor selects replication/cmdb-metrics")
        assert "seam ServiceMonitor -> Service" in found and "sr-stream-replicator-workers" in found

        # 2. A metric renamed in the worker (as Prometheus then ingests it: under the new name).
        def rename_metric(obj: dict[str, Any]) -> None:
            if obj["kind"] == "ServiceMonitor" and obj["metadata"]["name"] == "sr-stream-replicator-workers":
                obj["spec"]["endpoints"][0]["metricRelabelings"] = [{
                    "sourceLabels": ["__name__"], "regex": "stream_replicator_lag_msgs",
                    "targetLabel": "__name__", "replacement": "stream_replicator_lag_messages"}]

        found_rules = await _broken(system, rename_metric, rules, "stream_replicator_lag_msgs, which no target exports")
        assert {p.split(" reads ")[0].split(": ")[1] for p in found_rules} >= {
            "StreamReplicatorLagGrowing", "StreamReplicatorStuck"}

        # 3. A rule whose expression reads a label that does not exist.
        def rule_with_unknown_label(obj: dict[str, Any]) -> None:
            if obj["kind"] == "PrometheusRule":
                for rule in obj["spec"]["groups"][0]["rules"]:
                    if rule.get("alert") == "StreamReplicatorLagGrowing":
                        rule["expr"] = rule["expr"].replace("by (namespace, name)", "by (namespace, replication)")

        (found,) = await _broken(system, rule_with_unknown_label, rules, "reads label(s) ['replication']")
        assert found.startswith("seam exporter -> rule: StreamReplicatorLagGrowing")

        # 4. A dashboard query for a series nobody exports.
        board = copy.deepcopy(dashboard.load(DASHBOARD))
        panel = copy.deepcopy(board["panels"][2])
        panel["title"] = "Copied (renamed series)"
        panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("copied_msgs_total", "copied_messages_total")
        board["panels"].insert(2, panel)
        assert seams.empty_panels(system, skip_rows=NOT_HERE) == []
        (found,) = seams.empty_panels(system, skip_rows=NOT_HERE, board=board)
        assert "panel Overview/Copied (renamed series)" in found and "copied_messages_total" in found
