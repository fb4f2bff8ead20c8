"""The chart's ServiceMonitors, seen by their consumer: the prometheus-operator's selection rules
(tests/support/system/selection.py) applied to the Services the operator builds for its workers and
to the chart's own operator Service. A label or port name that drifts between the chart and the
operator shows here as a worker nobody scrapes, the way a cluster would show it."""

from __future__ import annotations

from typing import Any

import pytest
from helm_chart_support import RELEASE, RELEASE_NAMESPACE, find, one, render
from replication_operator.build import workload
from replication_operator.build.children import build_children
from replication_operator.model.spec import parse_spec

from tests.operator import helpers as h
from tests.support.system.selection import selections, selects_service, why_not_selected

MONITORING_ON = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
WORKERS = f"{RELEASE}-stream-replicator-workers"
OPERATOR = f"{RELEASE}-stream-replicator-operator"
# Every example that runs workers (the native engine's has no pods, so no Service).
WORKER_EXAMPLES = ["cmdb-city1", "orders-eu", "telemetry-region", "registrations-region", "inventory-dc1",
                   "orders-dc2"]


def _worker_objects(example: str, namespace: str) -> list[dict[str, Any]]:
    return build_children(parse_spec(h.example(example, namespace))).objects


def _monitors(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in find(render(values), "ServiceMonitor")}


@pytest.mark.parametrize("example", WORKER_EXAMPLES)
def test_the_charts_worker_monitor_scrapes_every_workers_metrics_service(example: str) -> None:
    service = one(_worker_objects(example, "replication"), "Service")
    monitors = _monitors(MONITORING_ON)
    workers = monitors[WORKERS]
    assert selects_service(workers, service), why_not_selected(workers, service)
    (chosen,) = [s for s in selections(monitors.values(), [service])]
    assert chosen.monitor == f"{RELEASE_NAMESPACE}/{WORKERS}"
    assert chosen.port["targetPort"] == "metrics"
    deployment = one(_worker_objects(example, "replication"), "Deployment")
    container_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert chosen.port["targetPort"] in container_ports, "the Service's targetPort names no container port"


def test_the_operators_own_monitor_and_the_charts_select_by_the_same_label() -> None:
    """A resource's own ServiceMonitor (`monitoring.serviceMonitor`) and the chart's agree on the
    component label, so turning one on instead of the other scrapes the same Service."""
    resource = h.example("cmdb-city1", "replication")
    resource["spec"].setdefault("monitoring", {})["serviceMonitor"] = {"enabled": True}
    objects = build_children(parse_spec(resource)).objects
    service, own = one(objects, "Service"), one(objects, "ServiceMonitor")
    assert selects_service(own, service), why_not_selected(own, service)
    chart_selector = _monitors(MONITORING_ON)[WORKERS]["spec"]["selector"]["matchLabels"]
    component = "app.kubernetes.io/component"
    assert chart_selector[component] == own["spec"]["selector"]["matchLabels"][component] == workload.METRICS_COMPONENT


def test_served_namespaces_bound_the_worker_monitor() -> None:
    values = {**MONITORING_ON, "rbac": {"namespaced": True}, "operator": {"namespaces": ["team-a"]}}
    workers = _monitors(values)[WORKERS]
    inside = one(_worker_objects("cmdb-city1", "team-a"), "Service")
    outside = one(_worker_objects("cmdb-city1", "team-b"), "Service")
    assert selects_service(workers, inside), why_not_selected(workers, inside)
    assert not selects_service(workers, outside)


def test_each_metrics_service_is_scraped_by_exactly_one_monitor() -> None:
    """Workers by the workers' monitor, the operator by its own (with honorLabels): nothing twice."""
    objects = render(MONITORING_ON)
    services = [one(objects, "Service"), one(_worker_objects("telemetry-region", RELEASE_NAMESPACE), "Service")]
    chosen = selections(find(objects, "ServiceMonitor"), services)
    by_service = {s.service: s.monitor.split("/")[1] for s in chosen}
    assert len(chosen) == len(by_service) == 2, chosen
    assert by_service[f"{RELEASE_NAMESPACE}/{RELEASE}-stream-replicator-metrics"] == OPERATOR
    assert by_service[f"{RELEASE_NAMESPACE}/telemetry-region-metrics"] == WORKERS


def test_a_renamed_service_label_is_seen_as_a_worker_nobody_scrapes() -> None:
    """The seam broken on purpose: the check names it."""
    service = one(_worker_objects("cmdb-city1", "replication"), "Service")
    service["metadata"]["labels"]["app.kubernetes.io/component"] = "worker"
    workers = _monitors(MONITORING_ON)[WORKERS]
    assert not selects_service(workers, service)
    assert "does not match" in why_not_selected(workers, service)


def test_selection_follows_the_prometheus_operators_rules() -> None:
    """matchExpressions (In, NotIn, Exists, DoesNotExist) AND matchLabels; namespaceSelector absent
    means the monitor's own namespace; an endpoint names a Service port by name."""
    service = one(_worker_objects("cmdb-city1", RELEASE_NAMESPACE), "Service")
    monitor: dict[str, Any] = {"metadata": {"name": "m", "namespace": RELEASE_NAMESPACE},
                               "spec": {"endpoints": [{"port": "metrics"}], "selector": {}}}
    assert selects_service(monitor, service)  # an empty selector selects every Service
    expressions = [
        ({"key": "app.kubernetes.io/component", "operator": "In", "values": ["metrics"]}, True),
        ({"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["metrics"]}, False),
        ({"key": "app.kubernetes.io/instance", "operator": "Exists"}, True),
        ({"key": "app.kubernetes.io/instance", "operator": "DoesNotExist"}, False),
    ]
    for expression, expected in expressions:
        monitor["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": "stream-replicator"},
                                       "matchExpressions": [expression]}
        assert selects_service(monitor, service) is expected, expression
    monitor["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": "stream-replicator"}}
    monitor["metadata"]["namespace"] = "elsewhere"
    assert not selects_service(monitor, service)
    monitor["spec"]["namespaceSelector"] = {"any": True}
    assert selects_service(monitor, service)
    monitor["spec"]["endpoints"] = [{"port": "http"}]
    assert selections([monitor], [service]) == []
