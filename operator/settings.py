"""The operator's own settings: images, intervals and the tenancy policy, from the environment the
Helm chart sets (`main.py` adds a flag for each policy setting, which wins over its variable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from replication_operator.build import spark_application
from replication_operator.checks import policy
from replication_operator.model import images

from replicator.config.durations import parse_duration

# Policy settings: (field, environment variable); `main.py` adds a flag for each.
POLICY_ENV = (
    ("allowed_images", "STREAM_REPLICATOR_ALLOWED_IMAGES"),
    ("allowed_service_accounts", "STREAM_REPLICATOR_ALLOWED_SERVICE_ACCOUNTS"),
    ("unlabelled_secrets_namespaces", "STREAM_REPLICATOR_UNLABELLED_SECRETS_NAMESPACES"),
    ("allowed_nats_hosts", "STREAM_REPLICATOR_ALLOWED_NATS_HOSTS"),
    ("allowed_spark_conf", "STREAM_REPLICATOR_ALLOWED_SPARK_CONF"),
    ("allowed_spark_packages", "STREAM_REPLICATOR_ALLOWED_SPARK_PACKAGES"),
    ("allowed_priority_classes", "STREAM_REPLICATOR_ALLOWED_PRIORITY_CLASSES"),
    ("privileged_pods_namespaces", "STREAM_REPLICATOR_PRIVILEGED_PODS_NAMESPACES"),
)


def patterns(text: str) -> tuple[str, ...]:
    """Patterns separated by commas or white space."""
    return tuple(p for p in text.replace(",", " ").split() if p)


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings; the Helm chart sets them through the environment."""

    worker_image: str = images.DEFAULT_WORKER_IMAGE
    spark_image: str = images.DEFAULT_SPARK_IMAGE
    status_interval: float = 30.0
    resync_interval: float = 300.0
    nats_timeout: float = 5.0
    # The tenancy policy (checks/policy.py): secure by default, except NATS hosts (any).
    allowed_images: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    unlabelled_secrets_namespaces: tuple[str, ...] = ()
    allowed_nats_hosts: tuple[str, ...] = policy.ANY_HOST
    allowed_spark_conf: tuple[str, ...] = policy.DEFAULT_SPARK_CONF
    allowed_spark_packages: tuple[str, ...] = policy.DEFAULT_SPARK_PACKAGES
    allowed_priority_classes: tuple[str, ...] = policy.ANY_HOST
    privileged_pods_namespaces: tuple[str, ...] = ()
    # No cluster-scoped API calls (kopf neither lists namespaces nor watches CRDs): RBAC by Roles only.
    roles_only: bool = False
    certificate_warning: float = 14 * 86400.0  # warn when a mounted certificate expires sooner
    # Seconds from a replication's removal from its pool's ConfigMap until its pool's workers surely stopped
    # copying it (the kubelet syncs a mounted ConfigMap within about a minute, the worker reads it in 2 s).
    pool_reload_grace: float = 75.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Unset policy variables keep their defaults; a variable set to "" allows nothing more."""
        env = os.environ if env is None else env
        settings = {field: patterns(env[name]) for field, name in POLICY_ENV if name in env}
        return cls(
            worker_image=env.get(images.WORKER_IMAGE_ENV) or images.DEFAULT_WORKER_IMAGE,
            spark_image=env.get(images.SPARK_IMAGE_ENV) or images.DEFAULT_SPARK_IMAGE,
            status_interval=float(env.get("STREAM_REPLICATOR_STATUS_INTERVAL") or 30),
            resync_interval=float(env.get("STREAM_REPLICATOR_RESYNC_INTERVAL") or 300),
            nats_timeout=float(env.get("STREAM_REPLICATOR_NATS_TIMEOUT") or 5),
            certificate_warning=parse_duration(env.get("STREAM_REPLICATOR_CERTIFICATE_WARNING") or "14d"),
            pool_reload_grace=float(env.get("STREAM_REPLICATOR_POOL_RELOAD_GRACE") or 75),
            **settings,  # type: ignore[arg-type]
        )

    def make_policy(self) -> policy.Policy:
        """The operator's own images and Spark driver account are always allowed: it uses them
        when a spec names none."""
        return policy.Policy(
            own_images=(self.worker_image, self.spark_image or spark_application.DEFAULT_IMAGE),
            own_service_accounts=(spark_application.DEFAULT_SERVICE_ACCOUNT,),
            images=self.allowed_images,
            service_accounts=self.allowed_service_accounts,
            unlabelled_secrets_namespaces=self.unlabelled_secrets_namespaces,
            nats_hosts=self.allowed_nats_hosts,
            spark_conf=self.allowed_spark_conf,
            spark_packages=self.allowed_spark_packages,
            priority_classes=self.allowed_priority_classes,
            privileged_namespaces=self.privileged_pods_namespaces,
        )
