"""The tenancy policy's rules for pod templates (`spec.template`, `spec.fleetHealth.template`), pure.

A template shapes pods the operator creates with its own rights, so everything in it that widens
what a pod may do is refused unless the administrator allows it for the resource's namespace:
root (runAsUser 0, runAsNonRoot false), privileged containers, added capabilities, privilege
escalation, an unconfined seccomp profile or AppArmor annotation. A PriorityClass must match the
allowed patterns, and `system-*` classes (which preempt the cluster's own pods) a pattern of their
own. Fields that would widen more (host namespaces, volumes, sysctls) are not offered at all.
Secrets a template names (image pull Secrets, env `secretKeyRef`) go through the Secret label
rule with the others (checks/secrets.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from replication_operator.model.template import ContainerTemplate, PodTemplate, SeccompProfile

POD_SECURITY_NOT_ALLOWED = "PodSecurityNotAllowed"
PRIORITY_CLASS_NOT_ALLOWED = "PriorityClassNotAllowed"
# Annotations that loosen a pod's confinement (legacy seccomp and AppArmor forms).
LOOSENING_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/")


def _unconfined(profile: SeccompProfile | None) -> bool:
    return profile is not None and profile.type == "Unconfined"


def widenings(where: str, pod: PodTemplate | None, container: ContainerTemplate | None) -> list[str]:
    """What the template asks that widens a pod, each naming its field."""
    found: list[str] = []
    pod_sc = pod.security_context if pod else None
    if pod_sc is not None:
        if pod_sc.run_as_user == 0:
            found.append(f"{where}.pod.securityContext.runAsUser 0 (root)")
        if pod_sc.run_as_non_root is False:
            found.append(f"{where}.pod.securityContext.runAsNonRoot false")
        if _unconfined(pod_sc.seccomp_profile):
            found.append(f"{where}.pod.securityContext.seccompProfile Unconfined")
    sc = container.security_context if container else None
    if sc is not None:
        prefix = f"{where}.container.securityContext"
        if sc.run_as_user == 0:
            found.append(f"{prefix}.runAsUser 0 (root)")
        if sc.run_as_non_root is False:
            found.append(f"{prefix}.runAsNonRoot false")
        if sc.privileged:
            found.append(f"{prefix}.privileged true")
        if sc.allow_privilege_escalation:
            found.append(f"{prefix}.allowPrivilegeEscalation true")
        if sc.capabilities and sc.capabilities.add:
            found.append(f"{prefix}.capabilities.add {', '.join(sc.capabilities.add)}")
        if _unconfined(sc.seccomp_profile):
            found.append(f"{prefix}.seccompProfile Unconfined")
    annotations = pod.metadata.annotations if pod and pod.metadata else {}
    for key in sorted(annotations):
        if key.startswith(LOOSENING_ANNOTATIONS):
            found.append(f'{where}.pod.metadata.annotations "{key}"')
    return found


def priority_class_allowed(name: str, patterns: Iterable[str]) -> bool:
    """Matched by a pattern; a `system-*` class only by a pattern that names `system-` itself."""
    chosen = [p for p in patterns if not name.startswith("system-") or p.startswith("system-")]
    return any(fnmatch.fnmatchcase(name, p) for p in chosen)
