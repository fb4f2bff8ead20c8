"""`spec.networkPolicy`: an optional NetworkPolicy that fences the worker pods in."""

from __future__ import annotations

from typing import Any

from replication_operator.model.fields import Model, field


class NetworkPolicySettings(Model):
    enabled: bool = field(
        "Create a NetworkPolicy for the worker pods: egress only to the ports of the NATS URLs (to their "
        "addresses when the URLs give IP addresses) and to DNS, ingress only to the metrics port.", False)
    metrics_from: list[dict[str, Any]] = field(
        "Who may scrape the metrics port: core/v1 NetworkPolicyPeers (podSelector, namespaceSelector, "
        "ipBlock), passed unchanged. Empty: any pod.", default_factory=list,
        items={"type": "object", "description": "A core/v1 NetworkPolicyPeer.",
               "x-kubernetes-preserve-unknown-fields": True})
    dns_port: int = field("Port of the cluster DNS the pods resolve NATS host names with.", 53, minimum=1,
                          maximum=65535)
