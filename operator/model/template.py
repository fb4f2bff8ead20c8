"""`spec.template` and `spec.fleetHealth.template`: how a platform shapes the worker and Spark pods
(Strimzi's `template`, cut down to what does not need a privileged author).

Only fields the tenancy policy can reason about are offered: no host namespaces, no volumes, no
sysctls or SELinux options (the CRD prunes anything else). A given `securityContext` replaces the
operator's own in full, so a platform that assigns UIDs itself (OpenShift's restricted-v2 SCC) can
leave `runAsUser` unset; checks/pod_policy.py refuses what would widen a pod (root, privileged,
added capabilities, privilege escalation, an unconfined seccomp profile) unless the administrator
allows it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator
from replication_operator.model.fields import DNS_SUBDOMAIN, Model, field, key_field, name_field
from replication_operator.model.pods import Quantity, Resources, Toleration

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class Metadata(Model):
    labels: dict[str, str] = field("Labels added to the pods (the operator's own labels win).", default_factory=dict)
    annotations: dict[str, str] = field("Annotations added to the pods.", default_factory=dict)


class LocalObjectReference(Model):
    name: str = name_field("Name of the Secret, in the resource's namespace.")


class SeccompProfile(Model):
    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = field(
        "Which seccomp profile: RuntimeDefault, Localhost (localhostProfile) or Unconfined (refused unless "
        "the policy allows privileged pods).")
    localhost_profile: str | None = field("Profile file on the node, for type Localhost.", None, maxLength=1024)


class PodSecurityContext(Model):
    run_as_user: int | None = field("UID of the pod's processes; leave unset for the platform to assign one "
                                    "(OpenShift restricted-v2). 0 is refused unless the policy allows.", None,
                                    format="int64", minimum=0)
    run_as_group: int | None = field("GID of the pod's processes; unset: the image's or the platform's.", None,
                                     format="int64", minimum=0)
    run_as_non_root: bool | None = field("Refuse to start a container that would run as root.", None)
    fs_group: int | None = field("Group that owns the pod's volumes; unset: the platform's.", None,
                                 format="int64", minimum=0)
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = field(
        "When volume ownership is changed to fsGroup.", None)
    supplemental_groups: list[int] | None = field("Extra groups of the pod's processes.", None, maxItems=32)
    seccomp_profile: SeccompProfile | None = field("The pod's seccomp profile.", None)


class Capabilities(Model):
    add: list[str] = field("Capabilities added (refused unless the policy allows privileged pods).",
                           default_factory=list, maxItems=64)
    drop: list[str] = field("Capabilities dropped; `ALL` is the operator's default.", default_factory=list,
                            maxItems=64)


class ContainerSecurityContext(Model):
    run_as_user: int | None = field("UID of the container's process; unset: the pod's.", None,
                                    format="int64", minimum=0)
    run_as_group: int | None = field("GID of the container's process; unset: the pod's.", None,
                                     format="int64", minimum=0)
    run_as_non_root: bool | None = field("Refuse to start the container as root.", None)
    read_only_root_filesystem: bool | None = field("Mount the container's root file system read-only.", None)
    allow_privilege_escalation: bool | None = field(
        "Let a process gain more privileges than its parent (true is refused unless the policy allows).", None)
    privileged: bool | None = field("Run privileged (true is refused unless the policy allows).", None)
    capabilities: Capabilities | None = field("Capabilities added and dropped.", None)
    seccomp_profile: SeccompProfile | None = field("The container's seccomp profile.", None)


class KeyRef(Model):
    name: str = name_field("Name of the object, in the resource's namespace.")
    key: str = key_field("Key in the object.")
    optional: bool | None = field("Start the pod even when the object or key is missing.", None)


class FieldRef(Model):
    field_path: str = field("Field of the pod, e.g. `metadata.labels['zone']` or `spec.nodeName`.", maxLength=256)
    api_version: str | None = field("API version the path is in; default v1.", None, maxLength=64)


class ResourceFieldRef(Model):
    resource: str = field("Resource of the container, e.g. `limits.memory`.", maxLength=64)
    container_name: str | None = field("Container; default this one.", None, maxLength=63)
    divisor: Quantity | None = field("Unit the value is given in, e.g. `1Mi`.", None)


class EnvSource(Model):
    """Where an env var's value comes from: exactly one of the four."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": [{
        "rule": "(has(self.fieldRef) ? 1 : 0) + (has(self.resourceFieldRef) ? 1 : 0) + "
                "(has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0) == 1",
        "message": "valueFrom takes exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef"}]}}

    field_ref: FieldRef | None = field("A field of the pod.", None)
    resource_field_ref: ResourceFieldRef | None = field("A resource request or limit of the container.", None)
    config_map_key_ref: KeyRef | None = field("A key of a ConfigMap.", None)
    secret_key_ref: KeyRef | None = field(
        "A key of a Secret; the Secret must be usable under the tenancy policy (labelled), like every Secret a "
        "resource names.", None)

    @model_validator(mode="after")
    def _one(self) -> EnvSource:
        given = [v for v in (self.field_ref, self.resource_field_ref, self.config_map_key_ref, self.secret_key_ref)
                 if v is not None]
        if len(given) != 1:
            raise ValueError("valueFrom takes exactly one of fieldRef, resourceFieldRef, configMapKeyRef, "
                             "secretKeyRef")
        return self


class EnvVar(Model):
    model_config = {"json_schema_extra": {"x-kubernetes-validations": [{
        "rule": "!(has(self.value) && has(self.valueFrom))", "message": "env takes value or valueFrom, not both"}]}}

    name: str = field("Name of the variable.", maxLength=256, pattern=ENV_NAME)
    value: str | None = field("Its value.", None)
    value_from: EnvSource | None = field("Where its value comes from.", None)


class PodTemplate(Model):
    """Pod-level settings, added to (or, for securityContext, replacing) the operator's own."""

    metadata: Metadata | None = field("Labels and annotations added to the pods.", None)
    image_pull_secrets: list[LocalObjectReference] = field(
        "Secrets holding registry credentials for the image (labelled usable, like every Secret a resource "
        "names).", default_factory=list, maxItems=16)
    priority_class_name: str | None = field(
        "PriorityClass of the pods; the tenancy policy decides which (never system-* by default).", None,
        maxLength=253, pattern=DNS_SUBDOMAIN)
    topology_spread_constraints: list[dict[str, Any]] = field(
        "core/v1 TopologySpreadConstraints, passed to the pods unchanged.", default_factory=list, maxItems=16,
        items={"type": "object", **PRESERVE})
    security_context: PodSecurityContext | None = field(
        "The pods' securityContext, replacing the operator's own (runAsUser 10001, runAsNonRoot, RuntimeDefault "
        "seccomp) in full; leave runAsUser unset for the platform to assign one.", None)
    node_selector: dict[str, str] = field("Node labels the pods must run on (merged over spec.nodeSelector).",
                                          default_factory=dict)
    tolerations: list[Toleration] = field("Taints the pods tolerate (added to spec.tolerations).",
                                          default_factory=list)
    affinity: dict[str, Any] | None = field("A core/v1 Affinity, passed to the pods unchanged (wins over "
                                            "spec.affinity).", None, **PRESERVE)
    termination_grace_period_seconds: int | None = field(
        "Seconds a stopping pod gets to finish its work; default 30.", None, format="int64", minimum=0,
        maximum=3600)


class ContainerTemplate(Model):
    """Settings of the one container (the worker, or the Spark driver and executors)."""

    env: list[EnvVar] = field("Environment variables added to the container (the operator's own win).",
                              default_factory=list, maxItems=64)
    resources: Resources | None = field("Container resources; win over spec.resources.", None)
    security_context: ContainerSecurityContext | None = field(
        "The container's securityContext, replacing the operator's own in full (by default no privilege "
        "escalation, a read-only root file system, all capabilities dropped, RuntimeDefault seccomp).", None)


class DisruptionBudget(Model):
    """The worker PodDisruptionBudget's limit: one of the two (default maxUnavailable 1)."""

    model_config = {"json_schema_extra": {"x-kubernetes-validations": [{
        "rule": "!(has(self.maxUnavailable) && has(self.minAvailable))",
        "message": "podDisruptionBudget takes maxUnavailable or minAvailable, not both"}]}}

    max_unavailable: int | str | None = field(
        "Pods that may be down at once for a voluntary disruption (a number or a percentage).", None,
        **{"x-kubernetes-int-or-string": True})
    min_available: int | str | None = field(
        "Pods that must stay up during a voluntary disruption (a number or a percentage).", None,
        **{"x-kubernetes-int-or-string": True})

    @model_validator(mode="after")
    def _one(self) -> DisruptionBudget:
        if self.max_unavailable is not None and self.min_available is not None:
            raise ValueError("spec.template.podDisruptionBudget takes maxUnavailable or minAvailable, not both")
        return self

    def limit(self) -> dict[str, int | str]:
        if self.min_available is not None:
            return {"minAvailable": self.min_available}
        return {"maxUnavailable": 1 if self.max_unavailable is None else self.max_unavailable}


class WorkerTemplate(Model):
    pod: PodTemplate | None = field("The worker pods.", None)
    container: ContainerTemplate | None = field("The worker container.", None)
    pod_disruption_budget: DisruptionBudget | None = field(
        "The workers' PodDisruptionBudget; default maxUnavailable 1.", None)


class SparkTemplate(Model):
    pod: PodTemplate | None = field("The Spark driver and executor pods (both alike).", None)
    container: ContainerTemplate | None = field(
        "The Spark driver and executor containers (env and securityContext; Spark sizes them from "
        "fleetHealth.driver and executor, so resources are not taken here).", None)
