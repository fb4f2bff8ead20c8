"""A worker pool's objects, pure: one Deployment, one ConfigMap (every member's profile) and one metrics
Service (with a PodDisruptionBudget and a ServiceMonitor when its pods ask for them) for the
StreamReplications of a namespace that name the same `spec.pool`.

The pool's pods are a member's pods under the pool's name: the lone worker's Deployment built from
the member's spec, named `<pool>-pool`, running `replicate --reload` over every profile instead of
`--topic` over one. The first member (oldest first) sets them; another member joins only if its
own pods would be the same, field for field, and is refused naming the first field that differs
otherwise. The pod template carries no hash of the profiles: a member added, changed or removed
rewrites the ConfigMap alone, the kubelet swaps the mounted file and the worker reloads only the
profiles that changed; a change to the pods themselves (image, resources, template) rolls them.
Every member owns the pool's objects (an owner reference each, none the controller), so the
garbage collector keeps them while any member exists.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replication_operator.build import worker_config, workload
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import ReplicationSpec, SpecError

REPLICATE = ["replicate", "--config", naming.CONFIG_PATH, "--reload"]


@dataclass(frozen=True)
class Member:
    """A StreamReplication naming the pool: its typed spec, its uid, and the native engine's hand-over."""

    spec: ReplicationSpec
    uid: str
    resume_after: int | None = None

    @property
    def name(self) -> str:
        return self.spec.resource_name


@dataclass
class Pool:
    """The pool's desired objects, the pool objects that must not exist, and who is in it."""

    name: str
    objects: list[dict[str, Any]]
    absent: list[tuple[naming.Kind, str]]
    members: list[Member]  # in the ConfigMap, owners of every object
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)  # resource name -> (reason, message)
    kept: list[Member] = field(default_factory=list)  # refused, their last accepted profile running on
    config_text: str = ""

    @property
    def settings_owner(self) -> str | None:
        return self.members[0].name if self.members else None


def pool_spec(spec: ReplicationSpec) -> ReplicationSpec:
    """The member's spec as the pool's: the pool's objects are named and labelled after `<pool>-pool`."""
    assert spec.pool is not None
    renamed = spec.model_copy()
    renamed._namespace, renamed._resource_name = spec.namespace, naming.pool_base(spec.pool)
    return renamed


def _labelled(obj: dict[str, Any], pool: str) -> dict[str, Any]:
    obj["metadata"]["labels"] = {**obj["metadata"]["labels"], naming.LABEL_POOL: pool}
    return obj


def build_pool_deployment(spec: ReplicationSpec, worker_image: str) -> dict[str, Any]:
    """The Deployment the member's pods would be in a pool: its own, renamed, every profile reloaded."""
    assert spec.pool is not None
    deployment = workload.build_deployment(pool_spec(spec), "", worker_image)
    template = deployment["spec"]["template"]
    template["metadata"]["annotations"].pop(naming.ANNOTATION_CONFIG_HASH)
    template["metadata"]["labels"][naming.LABEL_POOL] = spec.pool
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == naming.CONTAINER]
    container["args"] = list(REPLICATE)
    return _labelled(deployment, spec.pool)


def pod_settings(spec: ReplicationSpec, worker_image: str) -> dict[str, Any]:
    """Everything of a member that shapes the pool's pods and how they are watched."""
    return {
        "spec": build_pool_deployment(spec, worker_image)["spec"],
        "monitoring": spec.monitoring.model_dump(by_alias=True),
    }


def first_difference(mine: Any, theirs: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first field (a dotted path, `[i]` for list items) where two documents differ."""
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        for key in sorted(set(mine) | set(theirs)):
            found = first_difference(mine.get(key), theirs.get(key), f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list):
        for index in range(max(len(mine), len(theirs))):
            a, b = (mine[index] if index < len(mine) else None), (theirs[index] if index < len(theirs) else None)
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if mine == theirs else (path, mine, theirs)


def mismatch(member: Member, owner: Member, worker_image: str) -> str | None:
    """Why `member` cannot run in the pods `owner` set (None: it can)."""
    found = first_difference(pod_settings(member.spec, worker_image), pod_settings(owner.spec, worker_image))
    if found is None:
        return None
    where, mine, theirs = found
    return (f"pool {member.spec.pool!r}: its pods are set by StreamReplication {owner.name!r}, and this "
            f"resource's differ at {where} ({_short(mine)} here, {_short(theirs)} in the pool); make them equal "
            f"or name another pool")


def _short(value: Any) -> str:
    text = "unset" if value is None else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def owner_references(members: Sequence[Member]) -> list[dict[str, Any]]:
    """One reference a member, none the controller: the objects stay while any member exists."""
    return [{"apiVersion": naming.API_VERSION, "kind": naming.KIND, "name": m.name, "uid": m.uid,
             "blockOwnerDeletion": True} for m in members]


def build_pool(pool: str, candidates: Sequence[Member], worker_image: str,
               tls_keys: Mapping[str, Collection[str]] | None = None,
               admitted: Callable[[ReplicationSpec], tuple[str, str] | None] | None = None,
               running: Mapping[str, Mapping[str, Any]] | None = None, paused: Collection[str] = ()) -> Pool:
    """The pool for its members, oldest first: the first admissible one sets the pods; each other one
    joins if its pods match and its profile is valid, else it is refused (reason, message).
    `admitted` says why the operator's policy refuses a spec, (reason, message), or None.
    `running`: the profiles the pool's ConfigMap holds for its members now. A member already in the
    pool that comes to be refused (its pods changed before the others', as a pool's pods are, one
    member at a time; a change the policy or the worker refuses) keeps its running profile until it
    is accepted again, as a refused lone resource keeps its children: a pool changes without a gap.
    A `paused` member (the pause annotation) is not looked at: its running profile stays as it is."""
    accepted: list[Member] = []
    refused: dict[str, tuple[str, str]] = {}
    frozen = [m for m in candidates if m.name in paused and m.name in (running or {})]
    for member in candidates:
        if member.name in paused:
            continue
        why = admitted(member.spec) if admitted else None
        if why:
            refused[member.name] = why
            continue
        try:
            worker_config.build_pool_config([(member.spec, member.resume_after)], tls_keys)
        except SpecError as err:
            refused[member.name] = (st.INVALID_SPEC, str(err))
            continue
        differs = mismatch(member, accepted[0], worker_image) if accepted else None
        if differs:
            refused[member.name] = (st.POOL_MISMATCH, differs)
            continue
        accepted.append(member)
    base = naming.pool_base(pool)
    every = [(naming.DEPLOYMENT, naming.deployment_name(base)), (naming.CONFIGMAP, naming.configmap_name(base)),
             (naming.SERVICE, naming.service_name(base)), (naming.PDB, naming.pdb_name(base)),
             (naming.SERVICE_MONITOR, naming.service_monitor_name(base))]
    if not accepted:
        return Pool(pool, [], every, [], refused)
    kept = [m for m in candidates if m.name in refused and m.name in (running or {})]
    for member in kept:
        reason, message = refused[member.name]
        refused[member.name] = (reason, message + " (its last accepted profile runs on in the pool)")
    config = worker_config.build_pool_config([(m.spec, m.resume_after) for m in accepted], tls_keys,
                                             {m.name: (running or {})[m.name] for m in (*kept, *frozen)})
    owner = pool_spec(accepted[0].spec)
    objects = [
        _labelled(workload.build_configmap(owner, config.text), pool),
        _labelled(workload.build_service(owner), pool),
        build_pool_deployment(accepted[0].spec, worker_image),
    ]
    if owner.replicas > 1:
        objects.append(_labelled(workload.build_pdb(owner), pool))
    if owner.monitoring.service_monitor.enabled:
        objects.append(_labelled(workload.build_service_monitor(owner), pool))
    owners = {m.name for m in (*accepted, *kept, *frozen)}
    refs = owner_references([m for m in candidates if m.name in owners])
    for obj in objects:
        obj["metadata"]["ownerReferences"] = copy.deepcopy(refs)
    built = {(naming.kind_of(o), o["metadata"]["name"]) for o in objects}
    return Pool(pool, objects, [k for k in every if k not in built], accepted, refused, kept, config.text)
