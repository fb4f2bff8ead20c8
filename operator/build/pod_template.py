"""A resource's pod template (model/template.py) laid over the pods the operator builds, pure.

The operator's own labels, annotations and env vars win over the template's (they select the pods,
roll them on config changes and tell the worker who it is); a template's securityContext replaces
the operator's in full, so a platform can leave the UID to itself.
"""

from __future__ import annotations

import copy
from typing import Any

from replication_operator.model.template import ContainerTemplate, PodTemplate


def _dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)


def env(container: ContainerTemplate | None, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template's env vars, then the operator's; a name the operator sets stays the operator's."""
    ours = {e["name"] for e in own}
    added = [_dump(e) for e in (container.env if container else []) if e.name not in ours]
    return [*copy.deepcopy(own), *added]


def apply(pod: PodTemplate | None, container: ContainerTemplate | None, pod_spec: dict[str, Any],
          main: dict[str, Any], labels: dict[str, str], annotations: dict[str, str]) -> dict[str, str]:
    """Lays the template over a Deployment's pod spec, its one container `main` and the pod's
    `annotations` (in place); returns the pod's labels."""
    if container is not None:
        main["env"] = env(container, main.get("env") or [])
        if container.security_context is not None:
            main["securityContext"] = _dump(container.security_context)
    if pod is None:
        return labels
    if pod.metadata is not None:
        for key, value in pod.metadata.annotations.items():
            annotations.setdefault(key, value)
        labels = {**pod.metadata.labels, **labels}
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": ref.name} for ref in pod.image_pull_secrets]
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    if pod.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = copy.deepcopy(pod.topology_spread_constraints)
    if pod.security_context is not None:
        pod_spec["securityContext"] = _dump(pod.security_context)
    if pod.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **pod.node_selector}
    if pod.tolerations:
        pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *(
            t.model_dump(by_alias=True, exclude_unset=True) for t in pod.tolerations)]
    if pod.affinity:
        pod_spec["affinity"] = copy.deepcopy(pod.affinity)
    if pod.termination_grace_period_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = pod.termination_grace_period_seconds
    return labels


def apply_spark(pod: PodTemplate | None, container: ContainerTemplate | None, spark_pod: dict[str, Any]) -> None:
    """Lays the template over a SparkApplication's driver or executor (`SparkPodSpec`, in place).
    Spread constraints have no field of their own there: they go into its pod `template`."""
    if container is not None:
        spark_pod["env"] = env(container, spark_pod.get("env") or [])
        if container.security_context is not None:
            spark_pod["securityContext"] = _dump(container.security_context)
    if pod is None:
        return
    if pod.metadata is not None:
        spark_pod["labels"] = {**pod.metadata.labels, **spark_pod.get("labels", {})}
        if pod.metadata.annotations:
            spark_pod["annotations"] = {**pod.metadata.annotations, **spark_pod.get("annotations", {})}
    if pod.priority_class_name:
        spark_pod["priorityClassName"] = pod.priority_class_name
    if pod.topology_spread_constraints:
        spark_pod["template"] = {"spec": {"topologySpreadConstraints": copy.deepcopy(
            pod.topology_spread_constraints)}}
    if pod.security_context is not None:
        spark_pod["podSecurityContext"] = _dump(pod.security_context)
    if pod.node_selector:
        spark_pod["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spark_pod["tolerations"] = [t.model_dump(by_alias=True, exclude_unset=True) for t in pod.tolerations]
    if pod.affinity:
        spark_pod["affinity"] = copy.deepcopy(pod.affinity)
    if pod.termination_grace_period_seconds is not None:
        spark_pod["terminationGracePeriodSeconds"] = pod.termination_grace_period_seconds


def spark_pull_secrets(pod: PodTemplate | None) -> list[str]:
    """A SparkApplication names its image pull Secrets once, for driver and executors, by name."""
    return [ref.name for ref in pod.image_pull_secrets] if pod else []
