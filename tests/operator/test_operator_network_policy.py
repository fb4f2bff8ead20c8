"""`spec.networkPolicy`: the workers' NetworkPolicy, validated against the Kubernetes schemas, and
created and deleted by the operator through kopf against the API emulator."""

from __future__ import annotations

from typing import Any

from replication_operator.build.children import Children, build_children
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.reconcile.reconciler import Reconciler

from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_kopf import NS, _create_with_secrets, _resource
from tests.support.kube_emulator import wait_for


def _spec(source: str, target: str, **policy: Any) -> dict[str, Any]:
    resource = h.example("cmdb-city1")
    resource["spec"]["source"]["url"], resource["spec"]["target"]["url"] = source, target
    resource["spec"]["networkPolicy"] = {"enabled": True, **policy}
    return resource


def _child(children: Children, kind: naming.Kind) -> dict[str, Any] | None:
    """The desired child of `kind`, if any."""
    return next((o for o in children.objects if (o["apiVersion"], o["kind"]) == (kind.api_version, kind.kind)), None)


def _policy(resource: dict[str, Any]) -> dict[str, Any]:
    policy = _child(build_children(parse_spec(resource)), naming.NETWORK_POLICY)
    assert policy is not None
    h.validate_k8s(policy)
    return policy


def test_egress_to_the_nats_ports_and_dns_ingress_to_metrics_only() -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    resource = _spec("nats://10.0.0.7:4222,nats://10.0.0.8:4222", "tls://nats.region.example:7422,wss://hub.example",
                     metricsFrom=[scraper])
    policy = _policy(resource)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == "cmdb-city1-workers"
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "stream-replicator",
                                                  "app.kubernetes.io/instance": "cmdb-city1",
                                                  "app.kubernetes.io/component": "worker"}
    deployment = _child(build_children(parse_spec(resource)), naming.DEPLOYMENT)
    assert deployment is not None
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}], "from": [scraper]}]
    assert spec["egress"] == [
        {"ports": [{"protocol": "TCP", "port": 443}]},  # a host name: any address
        {"ports": [{"protocol": "TCP", "port": 4222}], "to": [{"ipBlock": {"cidr": "10.0.0.7/32"}},
                                                              {"ipBlock": {"cidr": "10.0.0.8/32"}}]},
        {"ports": [{"protocol": "TCP", "port": 7422}]},
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    ]


def test_a_host_name_on_a_port_opens_it_to_any_address() -> None:
    spec = _policy(_spec("nats://10.0.0.7", "nats://nats.example,nats://[fd00::1]:4223"))["spec"]
    assert spec["egress"][:2] == [{"ports": [{"protocol": "TCP", "port": 4222}]},
                                  {"ports": [{"protocol": "TCP", "port": 4223}],
                                   "to": [{"ipBlock": {"cidr": "fd00::1/128"}}]}]
    assert "from" not in spec["ingress"][0]  # any pod may scrape


def test_off_by_default() -> None:
    children = build_children(parse_spec(h.example("cmdb-city1")))
    assert _child(children, naming.NETWORK_POLICY) is None
    assert (naming.NETWORK_POLICY, "cmdb-city1-workers") in children.absent


async def test_the_operator_creates_and_deletes_it(api: Api, operator: Reconciler) -> None:
    resource = _resource()
    resource["spec"]["networkPolicy"] = {"enabled": True}
    await _create_with_secrets(api, resource)
    policy = await wait_for(lambda: api.get(naming.NETWORK_POLICY, NS, "cmdb-city1-workers"))
    assert policy["metadata"]["ownerReferences"][0]["name"] == "cmdb-city1"
    assert policy["spec"]["egress"][0] == {"ports": [{"protocol": "TCP", "port": 1}],
                                           "to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}]}
    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"networkPolicy": {"enabled": False}}})
    await wait_for(lambda: api.get(naming.NETWORK_POLICY, NS, "cmdb-city1-workers") is None)
