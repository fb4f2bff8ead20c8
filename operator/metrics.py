"""The operator's own `/metrics`: per StreamReplication, what alerting needs and only the operator
knows. Deliberately small: the workers export everything about copying themselves.

Labels are `namespace` and `streamreplication` (scrape the operator with `honorLabels: true`, as the
chart's ServiceMonitor does, so `namespace` stays the resource's and not the operator's).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from replication_operator.spark_application import schedule_interval

from replicator.observe.metrics import PREFIX

LABELS = ("namespace", "streamreplication")
GAUGES = {
    "resource_replicas_desired": "Worker pods a StreamReplication asks for (spec.replicas)",
    "resource_replicas_ready": "Worker pods of a StreamReplication that are ready (status.readyReplicas)",
    "fleet_health_last_run_timestamp_seconds": "Last fleet-health run (status.fleet.lastRun), or the "
                                               "resource's creation until the first run, unix seconds",
    "fleet_health_interval_seconds": "Longest gap between two scheduled fleet-health runs "
                                     "(spec.fleetHealth.schedule), seconds",
}
METRIC_NAMES = sorted(PREFIX + n for n in GAUGES)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.gauges = {n: Gauge(PREFIX + n, h, LABELS, registry=self.registry) for n, h in GAUGES.items()}

    def update(self, namespace: str, name: str, *, desired: int, status: Mapping[str, Any],
               created: str | None, fleet_interval: float | None) -> None:
        """From the status the operator just wrote (and the spec behind it)."""
        labels = {"namespace": namespace, "streamreplication": name}
        self.gauges["resource_replicas_desired"].labels(**labels).set(desired)
        self.gauges["resource_replicas_ready"].labels(**labels).set(int(status.get("readyReplicas") or 0))
        last_run = _epoch((status.get("fleet") or {}).get("lastRun")) or _epoch(created)
        if fleet_interval is None or last_run is None:
            self._remove(("fleet_health_last_run_timestamp_seconds", "fleet_health_interval_seconds"), labels)
            return
        self.gauges["fleet_health_last_run_timestamp_seconds"].labels(**labels).set(last_run)
        self.gauges["fleet_health_interval_seconds"].labels(**labels).set(fleet_interval)

    def export(self, body: Mapping[str, Any], status: Mapping[str, Any], desired: int) -> tuple[str, str]:
        """From a resource and the status just written; returns its (namespace, name)."""
        meta = body["metadata"]
        fleet = (body.get("spec") or {}).get("fleetHealth")
        interval = _interval(str(fleet.get("schedule") or "")) if isinstance(fleet, Mapping) else None
        self.update(meta["namespace"], meta["name"], desired=desired, status=status,
                    created=meta.get("creationTimestamp"), fleet_interval=interval)
        return meta["namespace"], meta["name"]

    def forget(self, namespace: str, name: str) -> None:
        self._remove(tuple(GAUGES), {"namespace": namespace, "streamreplication": name})

    def _remove(self, names: tuple[str, ...], labels: dict[str, str]) -> None:
        for n in names:
            try:
                self.gauges[n].remove(labels["namespace"], labels["streamreplication"])
            except KeyError:
                pass


@functools.lru_cache(maxsize=256)
def _interval(schedule: str) -> float | None:
    return schedule_interval(schedule or None)


def _epoch(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
