"""Names, labels and annotations: deterministic, so restarts and re-applies find the same objects.

Kubernetes names never contain `_` and namespaces never contain `.`, so `<namespace>_<name>` with
`.` spelled `_` is injective: two resources never share a durable consumer by accident.
"""

from __future__ import annotations

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
FINALIZER = f"{GROUP}/kopf-finalizer"

CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/stream-replicator"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
SECRETS_DIR = f"{CONFIG_DIR}/secrets"
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


def service_monitor_name(name: str) -> str:
    return name


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
