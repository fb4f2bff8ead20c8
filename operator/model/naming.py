"""Names, labels and annotations: deterministic, so restarts and re-applies find the same objects.

Kubernetes names never contain `_` and namespaces never contain `.`, so `<namespace>_<name>` with
`.` spelled `_` is injective: two resources never share a durable consumer by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "streamreplicator.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StreamReplication"
PLURAL = "streamreplications"

MANAGER = "stream-replicator-operator"
FIELD_MANAGER = MANAGER

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
APP_NAME = "stream-replicator"

ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"
ANNOTATION_LEADER_ELECTION = f"{GROUP}/leader-election"
KOPF_PREFIX = GROUP
# Set to "true", reconciliation stops (nothing changed or deleted) until it is removed. Outside
# KOPF_PREFIX: kopf leaves its own prefix's annotations out of the diff, so no update would fire.
PAUSED_ANNOTATION = f"control.{GROUP}/paused"


def paused(body: Mapping[str, Any]) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(PAUSED_ANNOTATION, "")).strip().lower() == "true"
FINALIZER = f"{GROUP}/kopf-finalizer"

CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/stream-replicator"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
SECRETS_DIR = "/var/run/secrets/stream-replicator"
STATE_DIR = "/var/lib/stream-replicator"
CONTAINER = "replicator"
METRICS_PORT_NAME = "metrics"


def jetstream_token(namespace: str, name: str) -> str:
    """`<namespace>_<name>` as a JetStream-safe name (no `.`)."""
    return f"{namespace}_{name}".replace(".", "_")


def default_replicator_name(namespace: str, name: str) -> str:
    """The ordered durable consumer and the worker-name prefix when `spec.name` is absent."""
    return jetstream_token(namespace, name)


def default_queue_group(namespace: str, name: str) -> str:
    """The scaled mode's shared durable consumer when `spec.queueGroup` is absent."""
    return f"{jetstream_token(namespace, name)}_grp"


def profile(name: str) -> str:
    """The config's topic profile (`--topic`): the resource name, unique per namespace."""
    return name


def deployment_name(name: str) -> str:
    return name


def configmap_name(name: str) -> str:
    return f"{name}-config"


def service_name(name: str) -> str:
    return f"{name}-metrics"


def pdb_name(name: str) -> str:
    return name


def network_policy_name(name: str) -> str:
    return f"{name}-workers"


def service_monitor_name(name: str) -> str:
    return name


def fleet_health_name(name: str) -> str:
    return f"{name}-fleet-health"


LABEL_POOL = f"{GROUP}/pool"  # on a pool's objects: the pool's name (its members name it in spec.pool)


def pool_base(pool: str) -> str:
    """What a pool's objects are named after, as a resource's are after its name: `<pool>-pool`."""
    return f"{pool}-pool"


def pods_named_after(name: str, deployment: Mapping[str, Any] | None) -> str:
    """What a resource's pods are named and selected after: its own name, or its pool's (`<pool>-pool`)."""
    pool = ((deployment or {}).get("metadata") or {}).get("labels", {}).get(LABEL_POOL)
    return pool_base(pool) if pool else name


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` has an owner reference (controller or not) to the resource with this uid."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def secret_volume_name(side: str, what: str) -> str:
    return f"{side}-{what}"


def selector_labels(name: str) -> dict[str, str]:
    """Immutable Deployment selector: never add to it, or existing Deployments cannot be patched."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}


def labels(name: str, component: str = "worker") -> dict[str, str]:
    return {
        **selector_labels(name),
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_PART_OF: APP_NAME,
    }


def selector_string(name: str) -> str:
    """`status.selector` for the scale subresource (HPA, `kubectl scale`)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


class Kind:
    """An API resource the operator reads or writes, with what it takes to build its URLs."""

    def __init__(self, group: str, version: str, kind: str, plural: str) -> None:
        self.group = group
        self.version = version
        self.kind = kind
        self.plural = plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        url = f"{base}/namespaces/{namespace}/{self.plural}"
        if name:
            url += f"/{name}"
        if subresource:
            url += f"/{subresource}"
        return url

    def __repr__(self) -> str:
        return f"Kind({self.api_version} {self.kind})"


STREAM_REPLICATION = Kind(GROUP, VERSION, KIND, PLURAL)
CONFIGMAP = Kind("", "v1", "ConfigMap", "configmaps")
# The shared connection a side may name (model/connection.py).
CONNECTION_KIND = "NatsConnection"
CONNECTION_PLURAL = "natsconnections"
NATS_CONNECTION = Kind(GROUP, VERSION, CONNECTION_KIND, CONNECTION_PLURAL)
SERVICE = Kind("", "v1", "Service", "services")
SECRET = Kind("", "v1", "Secret", "secrets")
DEPLOYMENT = Kind("apps", "v1", "Deployment", "deployments")
PDB = Kind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
SERVICE_MONITOR = Kind("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")
NETWORK_POLICY = Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies")
SCHEDULED_SPARK_APPLICATION = Kind(
    "sparkoperator.k8s.io", "v1beta2", "ScheduledSparkApplication", "scheduledsparkapplications"
)
CHILD_KINDS = (CONFIGMAP, SERVICE, DEPLOYMENT, PDB, SERVICE_MONITOR, SCHEDULED_SPARK_APPLICATION, NETWORK_POLICY)
KINDS_BY_API = {(k.api_version, k.kind): k for k in (*CHILD_KINDS, SECRET, STREAM_REPLICATION, NATS_CONNECTION)}


def kind_of(obj: dict[str, object]) -> Kind:
    return KINDS_BY_API[(str(obj.get("apiVersion")), str(obj.get("kind")))]


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` is ours: its controller owner reference names the resource with this uid."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)
