"""The chart's KEDA recipe for scaled mode: ScaledObjects rendered by the real Helm engine, checked
against a restatement of KEDA's ScaledObject schema (keda.sh/v1alpha1, named as such: KEDA's CRD is
not shipped here), aimed at the StreamReplication's scale subresource and at the very durable
consumer the operator's workers share."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import jsonschema
import pytest
from helm_chart_support import chart, find, render
from replication_operator.build.children import build_children
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec

from tests.operator import helpers as h

STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
COUNT = {"type": "integer", "minimum": 0}
# KEDA's ScaledObject spec, as its documentation and CRD define the fields this recipe uses.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                                   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                  "name": {"type": "string"},
                                                  "envSourceContainerName": {"type": "string"}}},
                "minReplicaCount": COUNT, "maxReplicaCount": COUNT, "idleReplicaCount": COUNT,
                "pollingInterval": COUNT, "cooldownPeriod": COUNT,
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["type", "metadata"],
                    "properties": {"type": {"type": "string"}, "name": {"type": "string"},
                                   "metadata": STRING_MAP, "metricType": {"enum": ["AverageValue", "Value"]},
                                   "authenticationRef": {"type": "object"}}}},
            },
        },
    },
}
# The nats-jetstream scaler's metadata keys (KEDA's scaler documentation).
NATS_JETSTREAM_KEYS = {"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold",
                       "activationLagThreshold", "useHttps"}


def scaled_example() -> dict[str, Any]:
    resource = h.example("cmdb-city1", "city1")
    resource["spec"].update(mode="scaled", replicas=2, workersPerPod=2)
    return resource


def values(**entry: Any) -> dict[str, Any]:
    return {"keda": {"enabled": True, "scaledObjects": [{
        "name": "cmdb-city1", "namespace": "city1", "stream": "CMDB",
        "natsServerMonitoringEndpoint": "nats.city1.svc:8222", **entry}]}}


def test_off_by_default() -> None:
    assert find(render(), "ScaledObject") == []
    assert find(render({"keda": {"enabled": False, "scaledObjects": values()["keda"]["scaledObjects"]}}),
                "ScaledObject") == []


def test_scales_the_resource_on_its_group_durable() -> None:
    (so,) = find(render(values()), "ScaledObject")
    jsonschema.validate(so, SCALED_OBJECT)
    assert so["metadata"]["namespace"] == "city1"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": naming.API_VERSION, "kind": naming.KIND, "name": "cmdb-city1"}
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "nats-jetstream" and set(trigger["metadata"]) == NATS_JETSTREAM_KEYS
    meta = trigger["metadata"]
    assert (meta["stream"], meta["account"], meta["lagThreshold"], meta["useHttps"]) == ("CMDB", "$G", "1000", "false")
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)

    # The consumer is the one the operator's scaled workers share.
    children = build_children(parse_spec(scaled_example()))
    config = children.config_text
    assert meta["consumer"] == naming.default_queue_group("city1", "cmdb-city1") == "city1_cmdb-city1_grp"
    assert meta["consumer"] in config

    # KEDA scales through /scale: the CRD serves it on spec.replicas, with the status selector.
    (version,) = [v for v in h.crd()["spec"]["versions"] if v["name"] == naming.VERSION]
    scale = version["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas"
    assert scale["labelSelectorPath"] == ".status.selector"


def test_a_named_queue_group_and_overrides() -> None:
    (so,) = find(render(values(consumer="shared_grp", lagThreshold=50, maxReplicaCount=20, useHttps=True)),
                 "ScaledObject")
    jsonschema.validate(so, SCALED_OBJECT)
    meta = so["spec"]["triggers"][0]["metadata"]
    assert (meta["consumer"], meta["lagThreshold"], meta["useHttps"]) == ("shared_grp", "50", "true")
    assert so["spec"]["maxReplicaCount"] == 20


@pytest.mark.parametrize("entry", [{"stream": None}, {"natsServerMonitoringEndpoint": "http://x:8222/"},
                                   {"lagThreshold": 0}, {"typo": 1}])
def test_schema_refuses_bad_entries(entry: dict[str, Any]) -> None:
    bad = values(**entry)
    obj = bad["keda"]["scaledObjects"][0]
    for key in [k for k, v in entry.items() if v is None]:
        del obj[key]
    with pytest.raises(helm.HelmValuesError):
        chart().validate_schema(chart().merge_values(bad))
