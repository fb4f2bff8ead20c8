"""The workers' NetworkPolicy (`spec.networkPolicy`), pure: what the pods may reach and who may
reach them.

A NetworkPolicy cannot name a host, so egress goes to the NATS URLs' ports, and to their addresses
only when every URL on a port gives an IP address; DNS stays open (host names must resolve).
Ingress is the metrics port alone (Prometheus, the kubelet's probes come from the node and are not
subject to it), from `metricsFrom` or any pod.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any

from replication_operator.model import naming
from replication_operator.model.spec import ReplicationSpec

from replicator.config.urls import split_urls

DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}


def _address(host: str) -> str | None:
    """`10.0.0.7/32` (or `/128`) for an IP address, None for a host name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"{ip}/{ip.max_prefixlen}"


def nats_destinations(spec: ReplicationSpec) -> dict[int, list[str] | None]:
    """Port -> the addresses on it (None: a host name among them, so any address)."""
    found: dict[int, list[str] | None] = {}
    for url in (*split_urls(spec.source.url), *split_urls(spec.target.url)):
        parsed = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
        port = parsed.port or DEFAULT_PORTS.get(parsed.scheme, 4222)
        address = _address(parsed.hostname or "")
        known = found.get(port, [])
        if address is None or known is None:
            found[port] = None
        elif address not in known:
            found[port] = [*known, address]
    return dict(sorted(found.items()))


def build_network_policy(spec: ReplicationSpec) -> dict[str, Any]:
    settings = spec.network_policy
    egress: list[dict[str, Any]] = []
    for port, addresses in nats_destinations(spec).items():
        rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
        if addresses is not None:
            rule["to"] = [{"ipBlock": {"cidr": a}} for a in addresses]
        egress.append(rule)
    egress.append({"ports": [{"protocol": "UDP", "port": settings.dns_port},
                             {"protocol": "TCP", "port": settings.dns_port}]})
    ingress: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": spec.monitoring.port}]}
    if settings.metrics_from:
        ingress["from"] = [dict(peer) for peer in settings.metrics_from]
    name = spec.resource_name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": naming.network_policy_name(name), "namespace": spec.namespace,
                     "labels": naming.labels(name, "network-policy")},
        "spec": {
            "podSelector": {"matchLabels": {k: v for k, v in naming.labels(name).items()
                                            if k in (*naming.selector_labels(name), naming.LABEL_COMPONENT)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [ingress],
            "egress": egress,
        },
    }
