"""Which scrape targets a ServiceMonitor yields, under the prometheus-operator's rules.

The consumer of the chart's ServiceMonitors is the prometheus-operator: it picks Services by
`namespaceSelector` (`any`, `matchNames`, else the monitor's own namespace) and `selector`
(`matchLabels` and `matchExpressions`, ANDed; an empty selector selects every Service), then, per
endpoint, the Service port whose *name* is `port` (or whose `targetPort` is the endpoint's
`targetPort`), then the addresses of the Service's Endpoints on that port. Tests and the system
harness use these rules, so a label or port name that drifts between the chart and the operator is
seen the way Prometheus would see it: as no target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = list(expression.get("values") or [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown label selector operator {operator!r}")


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector: every matchLabels pair and every matchExpressions entry holds."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_expression_holds(e, labels) for e in selector.get("matchExpressions") or [])


def namespace_matches(monitor: Mapping[str, Any], namespace: str) -> bool:
    """`namespaceSelector`: `any: true`, a `matchNames` list, or (absent) the monitor's own namespace."""
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return True
    names = chosen.get("matchNames")
    if names:
        return namespace in names
    return namespace == monitor["metadata"].get("namespace")


def selects_service(monitor: Mapping[str, Any], service: Mapping[str, Any]) -> bool:
    """Whether the monitor's namespace and label selectors pick the Service."""
    meta = service["metadata"]
    return namespace_matches(monitor, meta.get("namespace", "default")) and label_selector_matches(
        monitor["spec"].get("selector"), meta.get("labels") or {}
    )


def service_port(endpoint: Mapping[str, Any], service: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Service port an endpoint names: by `port` (the port's name), else by `targetPort`."""
    for port in service["spec"].get("ports") or []:
        if "port" in endpoint and port.get("name") == endpoint["port"]:
            return dict(port)
        if "port" not in endpoint and "targetPort" in endpoint and port.get("targetPort") == endpoint["targetPort"]:
            return dict(port)
    return None


@dataclass(frozen=True)
class Selected:
    """One (monitor endpoint, Service port) pair the prometheus-operator would turn into a scrape job."""

    monitor: str  # <namespace>/<name> of the ServiceMonitor
    index: int  # the endpoint's index in spec.endpoints
    service: str  # <namespace>/<name>
    namespace: str
    port: dict[str, Any]
    endpoint: dict[str, Any] = field(hash=False, compare=False)


def selections(monitors: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]]) -> list[Selected]:
    """Every (monitor endpoint, Service port) the prometheus-operator would scrape."""
    found: list[Selected] = []
    services = list(services)
    for monitor in monitors:
        mmeta = monitor["metadata"]
        for service in services:
            if not selects_service(monitor, service):
                continue
            smeta = service["metadata"]
            for index, endpoint in enumerate(monitor["spec"].get("endpoints") or []):
                port = service_port(endpoint, service)
                if port is None:
                    continue
                found.append(Selected(
                    monitor=f"{mmeta.get('namespace')}/{mmeta['name']}",
                    index=index,
                    service=f"{smeta.get('namespace', 'default')}/{smeta['name']}",
                    namespace=smeta.get("namespace", "default"),
                    port=port,
                    endpoint=dict(endpoint),
                ))
    return found


def why_not_selected(monitor: Mapping[str, Any], service: Mapping[str, Any]) -> str:
    """The seam a monitor misses a Service by, in words (for assertion messages)."""
    meta = service["metadata"]
    name = f"{meta.get('namespace')}/{meta['name']}"
    if not namespace_matches(monitor, meta.get("namespace", "default")):
        return f"namespaceSelector {monitor['spec'].get('namespaceSelector')} excludes {name}"
    selector = monitor["spec"].get("selector") or {}
    labels = meta.get("labels") or {}
    if not label_selector_matches(selector, labels):
        return f"selector {selector} does not match {name}'s labels {labels}"
    ports = [p.get("name") for p in service["spec"].get("ports") or []]
    wanted = [e.get("port", e.get("targetPort")) for e in monitor["spec"].get("endpoints") or []]
    return f"endpoint ports {wanted} name none of {name}'s ports {ports}"
