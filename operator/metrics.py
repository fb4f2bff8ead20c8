"""The operator's own `/metrics`: per StreamReplication, what alerting and the dashboard need and only
the operator knows. Deliberately small: the workers export everything about copying themselves.

Labels are `namespace` and `streamreplication` (scrape the operator with `honorLabels: true`, as the
chart's ServiceMonitor does, so `namespace` stays the resource's and not the operator's); the fleet
gauges add `state` and `site`. Every series of a resource goes when the resource does, and a site's
when it leaves the fleet summary.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from replication_operator.build.spark_application import schedule_interval
from replication_operator.engine.choice import NATIVE

from replicator.observe.metrics import PREFIX

LABELS = ("namespace", "streamreplication")
STATES = ("healthy", "timeout", "expired")
# name -> (help, labels after namespace and streamreplication)
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "resource_replicas_desired": ("Worker pods a StreamReplication asks for (spec.replicas); 1 on the native "
                                  "engine", ()),
    "resource_replicas_ready": ("Worker pods of a StreamReplication that are ready (status.readyReplicas); on "
                                "the native engine 1 while its Ready condition is True", ()),
    "resource_copy_loop": ("1 while a worker of a StreamReplication refuses a copy loop (the CopyLoop "
                           "condition is True), else 0", ()),
    "fleet_health_last_run_timestamp_seconds": ("Last fleet-health run (status.fleet.lastRun), or the resource's "
                                                "creation until the first run, unix seconds", ()),
    "fleet_health_interval_seconds": ("Longest gap between two scheduled fleet-health runs "
                                      "(spec.fleetHealth.schedule), seconds", ()),
    "fleet_health_nodes": ("Nodes in the last fleet-health summary by state (healthy, timeout, expired); "
                           "their sum is status.fleet.nodes", ("state",)),
    "fleet_health_availability_ratio": ("healthy / (healthy + timeout) in the last fleet-health summary "
                                        "(status.fleet.availability); absent when no node reports", ()),
    "fleet_health_site_nodes": ("Nodes of one site (the advisories' replicator) in the last fleet-health "
                                "summary, by state", ("site", "state")),
    "fleet_health_site_availability_ratio": ("healthy / (healthy + timeout) of one site in the last "
                                             "fleet-health summary; absent when none of its nodes reports",
                                             ("site",)),
}
# The native engine's series: the workers' own names and labels (`name` is the replicator name,
# `worker` is "native"), so the chart's lag alerts and the dashboard's lag panels cover it too.
NATIVE_LABELS = ("namespace", "name", "worker")
NATIVE_WORKER = "native"
NATIVE_GAUGES: dict[str, str] = {
    "lag_msgs": "Messages pending on the source consumer (not yet delivered or acknowledged); native engine: "
                "messages on the source not yet on the target",
    "current_sequence": "Last source stream sequence copied or skipped by this worker; native engine: the last "
                        "one on the target",
    "native_inactive_seconds": "Seconds a native entry has had messages waiting on the source without "
                               "delivering any (0 while it is caught up or moving)",
    "native_source_error": "1 while NATS reports an error for a native entry, else 0",
    "native_source_recreations": "How often the source stream of a native entry was found created again and "
                                 "the entry reset (status.native.recreations)",
}
METRIC_NAMES = sorted(PREFIX + n for n in GAUGES)
NATIVE_METRIC_NAMES = sorted(PREFIX + n for n in NATIVE_GAUGES)
FLEET = tuple(n for n in GAUGES if n.startswith("fleet_health_"))

Series = tuple[str, tuple[str, ...]]  # (gauge, label values after namespace and streamreplication)


def fleet_series(fleet: Mapping[str, Any], sites: Sequence[Mapping[str, Any]]) -> dict[Series, float]:
    """The fleet gauges' values from status.fleet and the summary's site rows (pure)."""
    values: dict[Series, float] = {}
    for state in STATES:
        if isinstance(fleet.get(state), int | float):
            values[("fleet_health_nodes", (state,))] = float(fleet[state])
    if isinstance(fleet.get("availability"), int | float):
        values[("fleet_health_availability_ratio", ())] = float(fleet["availability"])
    for site in sites:
        name = str(site["site"])
        for state in STATES:
            if isinstance(site.get(state), int | float):
                values[("fleet_health_site_nodes", (name, state))] = float(site[state])
        if isinstance(site.get("availability"), int | float):
            values[("fleet_health_site_availability_ratio", (name,))] = float(site["availability"])
    return values


def replica_values(status: Mapping[str, Any], desired: int) -> tuple[int, int]:
    """(desired, ready) for the replica gauges. The native engine runs no pods: it counts as one
    replica, ready while its Ready condition is True (the source entry is active, without error and
    within its lag bound), so `StreamReplicatorNotReady` covers it and stays quiet while it is healthy."""
    if status.get("engine") == NATIVE:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return 1, int(ready)
    return desired, int(status.get("readyReplicas") or 0)


@dataclass(frozen=True)
class NativeSample:
    """One native resource's measures: `name` its replicator name (the workers' `name` label)."""

    name: str
    lag: int | None
    current: int | None
    inactive: float
    error: bool
    recreations: int = 0


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.gauges = {n: Gauge(PREFIX + n, h, (*LABELS, *more), registry=self.registry)
                       for n, (h, more) in GAUGES.items()}
        self.series: dict[tuple[str, str], set[Series]] = {}  # what each resource exports now
        self.native = {n: Gauge(PREFIX + n, h, NATIVE_LABELS, registry=self.registry)
                       for n, h in NATIVE_GAUGES.items()}
        self.native_series: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (gauge, replicator name)

    def update_native(self, namespace: str, name: str, sample: NativeSample | None) -> None:
        """The native engine's series of one resource; None removes them (another engine, or gone)."""
        key = (namespace, name)
        values: dict[tuple[str, str], float] = {}
        if sample is not None:
            values[("native_source_error", sample.name)] = 1 if sample.error else 0
            values[("native_source_recreations", sample.name)] = sample.recreations
            for gauge, value in (("lag_msgs", sample.lag), ("current_sequence", sample.current),
                                 ("native_inactive_seconds", sample.inactive)):
                if value is not None:
                    values[(gauge, sample.name)] = value
        for gauge, replicator in self.native_series.get(key, set()) - set(values):
            self.native[gauge].remove(namespace, replicator, NATIVE_WORKER)
        for (gauge, replicator), value in values.items():
            self.native[gauge].labels(namespace, replicator, NATIVE_WORKER).set(value)
        self.native_series[key] = set(values)

    def update(self, namespace: str, name: str, *, desired: int, status: Mapping[str, Any],
               created: str | None, fleet_interval: float | None,
               sites: Sequence[Mapping[str, Any]] = ()) -> None:
        """From the status the operator just wrote (and the spec behind it); `sites`: the last fleet
        summary's site rows."""
        wanted, ready = replica_values(status, desired)
        values: dict[Series, float] = {
            ("resource_replicas_desired", ()): wanted,
            ("resource_replicas_ready", ()): ready,
        }
        loops = [c for c in status.get("conditions") or [] if c.get("type") == "CopyLoop"]
        values[("resource_copy_loop", ())] = 1.0 if any(c.get("status") == "True" for c in loops) else 0.0
        fleet = status.get("fleet") or {}
        last_run = _epoch(fleet.get("lastRun")) or _epoch(created)
        if fleet_interval is not None and last_run is not None:
            values[("fleet_health_last_run_timestamp_seconds", ())] = last_run
            values[("fleet_health_interval_seconds", ())] = fleet_interval
            # Only while fleet health is asked for: a removed spec.fleetHealth leaves a stale status.fleet.
            values.update(fleet_series(fleet, sites))
        key = (namespace, name)
        for gauge, labels in self.series.get(key, set()) - set(values):
            self._remove(key, gauge, labels)
        for (gauge, labels), value in values.items():
            self.gauges[gauge].labels(namespace, name, *labels).set(value)
        self.series[key] = set(values)

    def export(self, body: Mapping[str, Any], status: Mapping[str, Any], desired: int, schedule: str | None,
               sites: Sequence[Mapping[str, Any]] = ()) -> tuple[str, str]:
        """From a resource and the status just written; `schedule`: its fleet-health schedule ("" for
        the default, None without fleet health). Returns its (namespace, name)."""
        meta = body["metadata"]
        interval = _interval(schedule) if schedule is not None else None
        self.update(meta["namespace"], meta["name"], desired=desired, status=status,
                    created=meta.get("creationTimestamp"), fleet_interval=interval, sites=sites)
        return meta["namespace"], meta["name"]

    def forget(self, namespace: str, name: str) -> None:
        self.update_native(namespace, name, None)
        key = (namespace, name)
        for gauge, labels in self.series.pop(key, set()):
            self._remove(key, gauge, labels)

    def _remove(self, key: tuple[str, str], gauge: str, labels: tuple[str, ...]) -> None:
        try:
            self.gauges[gauge].remove(*key, *labels)
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
