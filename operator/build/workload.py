"""The worker's Kubernetes objects, pure: its ConfigMap, Deployment, metrics Service, PodDisruptionBudget
and ServiceMonitor, from a StreamReplication's typed spec.

Nothing here talks to the API. The reconciler adds owner references (`kopf.adopt`) and applies the
objects; everything else about them is decided here, so it is all unit-testable and validated
against the real Kubernetes schemas in the tests.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from replication_operator.build import pod_template, worker_config
from replication_operator.model import naming
from replication_operator.model.spec import ReplicationSpec, Side

RUN_AS = 10001  # the image's `replicator` user and group (Dockerfile)
# The `app.kubernetes.io/component` of the worker's metrics Service: what every ServiceMonitor selects
# it by, the operator's own (`build_service_monitor`) and the chart's (`metrics.serviceMonitor.selector`
# in helm/stream-replicator/values.yaml; tests/helm/test_monitoring_selection.py keeps them together).
METRICS_COMPONENT = "metrics"
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}


def _meta(spec: ReplicationSpec, name: str, component: str = "worker") -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": naming.labels(spec.resource_name, component)}


def build_configmap(spec: ReplicationSpec, config_text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, naming.configmap_name(spec.resource_name)),
        "data": {naming.CONFIG_KEY: config_text},
    }


def _secret_volumes(spec: ReplicationSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read-only Secret volumes for credentials (the one key), user and password (the two keys) and
    TLS (the whole Secret). Whole volumes, never `subPath`, so kubelet's updates reach the pods."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []

    def mount(side: Side, kind: str, secret: str, path: str, keys: list[str] | None = None) -> None:
        vol = naming.secret_volume_name(side, kind)
        source: dict[str, Any] = {"secretName": secret, "defaultMode": 0o440}
        if keys is not None:
            source["items"] = [{"key": key, "path": key} for key in keys]
        volumes.append({"name": vol, "secret": source})
        mounts.append({"name": vol, "mountPath": path, "readOnly": True})

    sides: tuple[Side, Side] = ("source", "target")
    for side in sides:
        endpoint = spec.endpoint(side)
        if endpoint.credentials_secret:
            mount(side, "credentials", endpoint.credentials_secret.name, worker_config.credentials_dir(side),
                  [endpoint.credentials_secret.key])
        if endpoint.basic_auth_secret:
            mount(side, "basic-auth", endpoint.basic_auth_secret.name, worker_config.basic_auth_dir(side),
                  list(endpoint.basic_auth_secret.keys))
        if endpoint.token_secret:
            mount(side, "token", endpoint.token_secret.name, worker_config.token_dir(side), [endpoint.token_secret.key])
        if endpoint.nkey_secret:
            mount(side, "nkey", endpoint.nkey_secret.name, worker_config.nkey_dir(side), [endpoint.nkey_secret.key])
        if endpoint.tls_secret:
            mount(side, "tls", endpoint.tls_secret, worker_config.tls_dir(side))
        if endpoint.ca_config_map:  # a CA is public: a ConfigMap (trust-manager's bundle), the one key
            ref, vol = endpoint.ca_config_map, naming.secret_volume_name(side, "ca")
            volumes.append({"name": vol, "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}],
                                                       "defaultMode": 0o444}})
            mounts.append({"name": vol, "mountPath": worker_config.ca_dir(side), "readOnly": True})
    return volumes, mounts


def _resources(spec: ReplicationSpec) -> dict[str, Any]:
    """The template's container resources, else the spec's, as given; else ours."""
    chosen = (spec.template and spec.template.container and spec.template.container.resources) or spec.resources
    given = chosen.model_dump(by_alias=True, exclude_unset=True) if chosen else None
    return given or copy.deepcopy(DEFAULT_RESOURCES)


def _strategy(spec: ReplicationSpec) -> dict[str, Any]:
    """Scaled and elected pods roll with no gap; a lone ordered pod must stop before its successor."""
    if spec.ordered and not spec.leader_election:
        return {"type": "Recreate"}
    surge: int | str = 1 if spec.ordered else "25%"
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": surge}}


def build_deployment(spec: ReplicationSpec, config_hash: str, worker_image: str) -> dict[str, Any]:
    name = spec.resource_name
    port = spec.monitoring.port
    secret_volumes, secret_mounts = _secret_volumes(spec)
    probe = {"httpGet": {"path": "/healthz", "port": naming.METRICS_PORT_NAME}}
    container: dict[str, Any] = {
        "name": naming.CONTAINER,
        "image": spec.image or worker_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["stream-replicator"],
        "args": ["--config", naming.CONFIG_PATH, "--topic", naming.profile(name)],
        "env": [
            {"name": "SR_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "ports": [{"name": naming.METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 60, "timeoutSeconds": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 2},
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": naming.METRICS_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 2,
        },
        "resources": _resources(spec),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "state", "mountPath": naming.STATE_DIR},
            *secret_mounts,
        ],
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        **spec.pod_annotations,
        naming.ANNOTATION_CONFIG_HASH: config_hash,
        naming.ANNOTATION_LEADER_ELECTION: "true" if spec.leader_election else "false",
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": naming.configmap_name(name)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "state", "emptyDir": {"sizeLimit": "256Mi"}},
            *secret_volumes,
        ],
    }
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_unset=True) for t in spec.tolerations]
    if spec.affinity:
        pod_spec["affinity"] = copy.deepcopy(spec.affinity)
    labels = naming.labels(name)
    if spec.template:
        labels = pod_template.apply(spec.template.pod, spec.template.container, pod_spec, container, labels,
                                    annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, naming.deployment_name(name)),
        "spec": {
            "replicas": spec.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": naming.selector_labels(name)},
            "strategy": _strategy(spec),
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def safe_strategy(desired: dict[str, Any], live: Mapping[str, Any] | None) -> dict[str, Any]:
    """Recreate for the one rollout that turns leader election on.

    Old pods without election would keep copying next to a newly elected leader during a rolling
    update; once every pod elects, rolling updates are safe again (a strategy change alone rolls nothing).
    """
    if not live:
        return desired
    template = desired["spec"]["template"]["metadata"]["annotations"]
    live_annotations = (
        ((live.get("spec") or {}).get("template") or {}).get("metadata", {}).get("annotations") or {}
    )
    turning_on = (
        template.get(naming.ANNOTATION_LEADER_ELECTION) == "true"
        and live_annotations.get(naming.ANNOTATION_LEADER_ELECTION) != "true"
    )
    if not turning_on:
        return desired
    result = copy.deepcopy(desired)
    result["spec"]["strategy"] = {"type": "Recreate"}
    return result


def build_service(spec: ReplicationSpec) -> dict[str, Any]:
    """Metrics Service; not-ready pods (standbys, pods still connecting) are scraped too."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, naming.service_name(spec.resource_name), METRICS_COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "publishNotReadyAddresses": True,
            "selector": naming.selector_labels(spec.resource_name),
            "ports": [{
                "name": naming.METRICS_PORT_NAME,
                "port": spec.monitoring.port,
                "targetPort": naming.METRICS_PORT_NAME,
                "protocol": "TCP",
            }],
        },
    }


def build_pdb(spec: ReplicationSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, naming.pdb_name(spec.resource_name)),
        "spec": {
            **(spec.template.pod_disruption_budget.limit() if spec.template and spec.template.pod_disruption_budget
               else {"maxUnavailable": 1}),
            "selector": {"matchLabels": naming.selector_labels(spec.resource_name)},
        },
    }


def build_service_monitor(spec: ReplicationSpec) -> dict[str, Any]:
    meta = _meta(spec, naming.service_monitor_name(spec.resource_name), METRICS_COMPONENT)
    monitor = spec.monitoring.service_monitor
    meta["labels"] = {**monitor.labels, **meta["labels"]}
    endpoint: dict[str, Any] = {"port": naming.METRICS_PORT_NAME, "path": "/metrics", "scheme": "http"}
    if monitor.interval:
        endpoint["interval"] = monitor.interval
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": naming.labels(spec.resource_name, METRICS_COMPONENT)},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "endpoints": [endpoint],
        },
    }
