"""The parts of a StreamReplication's spec that shape the worker pods and their metrics endpoint."""

from __future__ import annotations

from typing import Annotated

from pydantic import WithJsonSchema
from replication_operator.model.fields import QUANTITY, Model, OpenModel, field

# A resource quantity (`500m`, `1Gi`, 2): an int-or-string, as core/v1 has it.
Quantity = Annotated[int | str, WithJsonSchema({
    "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY, "x-kubernetes-int-or-string": True})]


class Resources(OpenModel):
    limits: dict[str, Quantity] | None = field("Most of each resource the worker container may use.", None)
    requests: dict[str, Quantity] | None = field("What the worker container is scheduled with.", None)


class Toleration(OpenModel):
    key: str | None = field("Taint key the toleration applies to; empty matches every key (with Exists).", None)
    operator: str | None = field("How the key and value are compared.", None, enum=["Exists", "Equal"])
    value: str | None = field("Taint value the toleration matches (with Equal).", None)
    effect: str | None = field("Taint effect the toleration matches; empty matches every effect.", None,
                               enum=["NoSchedule", "PreferNoSchedule", "NoExecute"])
    toleration_seconds: int | None = field(
        "How long a NoExecute taint is tolerated before the pod is evicted.", None, format="int64")


class ServiceMonitor(Model):
    enabled: bool = field("Create the ServiceMonitor (needs the Prometheus operator's CRD).", False)
    interval: str | None = field("Scrape interval, e.g. `30s`; default Prometheus's own.", None,
                                 maxLength=64, pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$")
    labels: dict[str, str] = field("Labels your Prometheus selects ServiceMonitors by.", default_factory=dict)


class Monitoring(Model):
    port: int = field("Port of /metrics, /healthz and /readyz in the pods.", 8080, minimum=1024, maximum=65535)
    service_monitor: ServiceMonitor = field(
        "Create a Prometheus operator ServiceMonitor (monitoring.coreos.com/v1).", default_factory=ServiceMonitor)
