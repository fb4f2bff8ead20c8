"""Applying a resource's children: server-side apply of what differs, deletion of the optional kinds no
longer wanted, and the memory of what was applied, so that a child's watch event tells drift (a
child deleted or edited by someone else) from the operator's own writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from replication_operator.build import workload
from replication_operator.build.children import Children
from replication_operator.kube import APIError, APINotFoundError, KubeApi, error_text
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.reconcile.events import Events

OPTIONAL_KINDS = (naming.SERVICE_MONITOR, naming.SCHEDULED_SPARK_APPLICATION)
ChildKey = tuple[str, str, str]  # (plural, namespace, name)


def contains(live: Any, desired: Any) -> bool:
    """Whether every field we set is in the live object with our value (server defaults are extra)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and contains(live[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(
            contains(a, b) for a, b in zip(live, desired, strict=True)
        )
    return bool(live == desired)


def _key(obj: Mapping[str, Any]) -> ChildKey:
    meta = obj["metadata"]
    return (naming.kind_of(dict(obj)).plural, meta["namespace"], meta["name"])


def _hash_of(obj: Mapping[str, Any] | None) -> str | None:
    if not obj:
        return None
    if obj.get("kind") == "Deployment":
        annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
        return annotations.get(naming.ANNOTATION_CONFIG_HASH)
    return None


def _update_reason(label: str, live: Mapping[str, Any], obj: Mapping[str, Any],
                   known: Mapping[str, Any] | None) -> tuple[str, str]:
    before, after = _hash_of(live), _hash_of(obj)
    if before != after:
        return "Updated", f"updated {label}: config hash {before} -> {after}, rolling the pods"
    if known is not None and contains(known, obj) and contains(obj, known):
        return "Reverted", f"put back {label} (changed outside the operator)"
    return "Updated", f"updated {label}"


@dataclass
class Applied:
    problems: list[st.Problem] = field(default_factory=list)
    deployment: dict[str, Any] | None = None  # the worker Deployment as the API server has it
    retry: bool = False  # a transient API failure: worth another pass soon


class Applier:
    def __init__(self, api: KubeApi, events: Events) -> None:
        self.api = api
        self.events = events
        self.desired: dict[ChildKey, dict[str, Any]] = {}

    async def apply(self, body: Mapping[str, Any], children: Children, cause: str) -> Applied:
        meta = body["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        owner = kopf.Body(dict(body))  # type: ignore[arg-type]
        applied = Applied()
        problems = applied.problems
        for obj in children.objects:
            kind = naming.kind_of(obj)
            kopf.adopt(obj, owner=owner)
            name = obj["metadata"]["name"]
            label = f"{kind.kind} {name}"
            try:
                live = await self.api.get(kind, namespace, name)
                if live is not None and not naming.controlled_by(live, uid):
                    problems.append(st.Problem(
                        st.NAME_CONFLICT, f"{label} exists and is not owned by this StreamReplication"))
                    continue
                if kind is naming.DEPLOYMENT:
                    obj = workload.safe_strategy(obj, live)
                key = _key(obj)
                known = self.desired.get(key)
                self.desired[key] = obj  # before the write: the watch event it causes must match
                if live is None:
                    result = await self.api.apply(obj)
                    if known is not None and cause != "create":
                        self.events.post(body, "Normal", "Restored", f"re-created {label} (it was deleted)")
                    else:
                        self.events.post(body, "Normal", "Created", f"created {label}")
                elif not contains(live, obj):
                    result = await self.api.apply(obj)
                    self.events.post(body, "Normal", *_update_reason(label, live, obj, known))
                else:
                    result = live
                if kind is naming.DEPLOYMENT:
                    applied.deployment = result
            except APINotFoundError as err:
                self.desired.pop(_key(obj), None)
                if kind in OPTIONAL_KINDS:
                    problems.append(st.Problem(
                        st.CRD_MISSING, f"{kind.kind} is not served by the API ({kind.api_version}): "
                                        f"install its CRD or turn the feature off"))
                else:
                    problems.append(st.Problem(st.APPLY_FAILED, f"{label}: {error_text(err)}"))
            except APIError as err:
                self.desired.pop(_key(obj), None)
                problems.append(st.Problem(st.APPLY_FAILED, f"{label}: {error_text(err)}"))
                applied.retry = applied.retry or err.retryable
        for kind, name in children.absent:
            self.desired.pop((kind.plural, namespace, name), None)
            live = await self.api.get_quietly(kind, namespace, name)
            if live is not None and naming.controlled_by(live, uid):
                try:
                    await self.api.delete(kind, namespace, name, uid=live["metadata"].get("uid"))
                    self.events.post(body, "Normal", "Deleted", f"deleted {kind.kind} {name} (no longer needed)")
                except APIError as err:
                    problems.append(st.Problem(
                        st.APPLY_FAILED, f"deleting {kind.kind} {name}: {error_text(err)}"))
                    applied.retry = True
        return applied

    def forget(self, uid: str) -> None:
        """The resource's children are no longer wanted (it is gone, or runs natively): a deletion
        is not drift."""
        for key in [k for k, v in self.desired.items() if naming.controlled_by(v, uid)]:
            self.desired.pop(key, None)

    def drifted(self, event_type: str, child: Mapping[str, Any]) -> bool:
        """Whether a watch event shows a child we applied deleted or changed by someone else."""
        meta = child.get("metadata") or {}
        desired = self.desired.get((naming.kind_of(dict(child)).plural, meta["namespace"], meta["name"]))
        return desired is not None and (event_type == "DELETED" or not contains(child, desired))
