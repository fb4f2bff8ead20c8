"""Every child of a StreamReplication built at once, with the optional kinds that must not exist.

One entry point keeps the reconciler, the image tests and the chart's examples on the same objects:
the worker config is built (and checked by the worker's own model) first, its hash rolls the pods,
and each optional kind (PodDisruptionBudget, ServiceMonitor, NetworkPolicy, ScheduledSparkApplication) is either
built or named in `absent`, so that turning a feature off deletes what the operator made for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from replication_operator.build import network_policy, spark_application, worker_config, workload
from replication_operator.model import images, naming
from replication_operator.model.spec import ReplicationSpec


@dataclass(frozen=True)
class BuildOptions:
    """What the builders need besides the spec: the images and what the operator observed."""

    worker_image: str = images.DEFAULT_WORKER_IMAGE
    spark_image: str | None = None
    tls_keys: Mapping[str, Collection[str]] | None = None  # a TLS Secret's name -> the keys it holds
    resume_after: int | None = None  # handed over by the native engine (status.resumeAfter)


@dataclass
class Children:
    """The desired children and the optional kinds that must not exist (deleted if we own them)."""

    config_text: str
    config_hash: str
    objects: list[dict[str, Any]]
    absent: list[tuple[naming.Kind, str]] = field(default_factory=list)


def _fleet_health(spec: ReplicationSpec, options: BuildOptions) -> dict[str, Any]:
    """The ScheduledSparkApplication, labelled like every other child (the pods keep the builder's own)."""
    app = spark_application.build_scheduled_spark_application(spec, options.tls_keys, options.spark_image)
    meta = app["metadata"]
    meta["labels"] = {**meta["labels"], **naming.labels(spec.resource_name, "fleet-health")}
    return app


def build_children(spec: ReplicationSpec, options: BuildOptions | None = None) -> Children:
    """Raises SpecError when the spec cannot work (the worker's model refuses its config, say)."""
    options = options or BuildOptions()
    if spec.pool:
        return _pooled(spec, options)
    config = worker_config.build_worker_config(spec, options.tls_keys, options.resume_after)
    name = spec.resource_name
    objects = [
        workload.build_configmap(spec, config.text),
        workload.build_service(spec),
        workload.build_deployment(spec, config.hash, options.worker_image),
    ]
    absent: list[tuple[naming.Kind, str]] = []
    if spec.replicas > 1:
        objects.append(workload.build_pdb(spec))
    else:
        absent.append((naming.PDB, naming.pdb_name(name)))
    if spec.monitoring.service_monitor.enabled:
        objects.append(workload.build_service_monitor(spec))
    else:
        absent.append((naming.SERVICE_MONITOR, naming.service_monitor_name(name)))
    if spec.network_policy.enabled:
        objects.append(network_policy.build_network_policy(spec))
    else:
        absent.append((naming.NETWORK_POLICY, naming.network_policy_name(name)))
    if spec.fleet_health:
        objects.append(_fleet_health(spec, options))
    else:
        absent.append((naming.SCHEDULED_SPARK_APPLICATION, naming.fleet_health_name(name)))
    return Children(config_text=config.text, config_hash=config.hash, objects=objects, absent=absent)


def _pooled(spec: ReplicationSpec, options: BuildOptions) -> Children:
    """A pool member's own children: only its fleet-health job. Its workers are the pool's
    (build/pool.py), so a lone worker's objects, left from before it joined, must go."""
    name = spec.resource_name
    objects = [_fleet_health(spec, options)] if spec.fleet_health else []
    absent = [(naming.DEPLOYMENT, naming.deployment_name(name)), (naming.CONFIGMAP, naming.configmap_name(name)),
              (naming.SERVICE, naming.service_name(name)), (naming.PDB, naming.pdb_name(name)),
              (naming.SERVICE_MONITOR, naming.service_monitor_name(name)),
              (naming.NETWORK_POLICY, naming.network_policy_name(name))]
    if not spec.fleet_health:
        absent.append((naming.SCHEDULED_SPARK_APPLICATION, naming.fleet_health_name(name)))
    return Children(config_text="", config_hash="", objects=objects, absent=absent)
