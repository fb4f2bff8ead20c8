"""Applying a worker pool (`spec.pool`): its members read from the API, its objects built whole
(build/pool.py) and applied, the pool objects no longer wanted deleted.

Any member's pass rebuilds its pool from every StreamReplication that names it, under one lock a
pool, so passes of several members never interleave and the last one wins with the whole truth.
A member that leaves (deleted, or its `spec.pool` changed) is dropped from the ConfigMap by its own
pass; its durable consumer may only go once the pool's workers have reloaded the file without it,
which the API cannot show: the kubelet syncs a mounted ConfigMap within about a minute and the
worker reads it within seconds, so the member waits a grace period after it left (`grace`, the
operator's `pool_reload_grace`). A member that moves (into a pool from pods of its own, out of a
pool, from one pool to another) never runs in two places at once: its own Deployment is deleted in
the foreground and gone before it joins, and a pool it left has had the grace period to stop it
before its new home starts it (`PoolHandover` meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from replication_operator.build import workload
from replication_operator.build.pool import Member, Pool, build_pool
from replication_operator.checks import connections
from replication_operator.kube import APIError, KubeApi, error_text
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import ReplicationSpec, SpecError, parse_spec
from replication_operator.reconcile.apply import Applier, contains
from replication_operator.reconcile.events import Events

Admitted = Callable[[ReplicationSpec], tuple[str, str] | None]
Nudge = Callable[[str, str], None]  # (namespace, name): another member's standing changed, pass it again
Standing = dict[str, tuple[str, str] | None]  # member name -> why it is refused, None while accepted


@dataclass
class PoolOutcome:
    problems: list[st.Problem] = field(default_factory=list)  # the member's own (refused, conflicts, API)
    deployment: dict[str, Any] | None = None  # the pool's Deployment as the API server has it
    retry: bool = False
    waiting: bool = False  # a handover: nothing of the member's new home may be applied yet


def _resume_after(body: Mapping[str, Any]) -> int | None:
    value = (body.get("status") or {}).get("resumeAfter")
    return int(value) if value else None


def _order(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


class Pools:
    def __init__(self, api: KubeApi, applier: Applier, events: Events, worker_image: str,
                 admitted: Admitted | None = None, nudge: Nudge | None = None, grace: float = 75.0) -> None:
        self.api, self.applier, self.events = api, applier, events
        self.worker_image = worker_image
        self.grace = grace
        self.admitted = admitted
        self.nudge = nudge
        self.standing: dict[tuple[str, str], Standing] = {}  # the members' standing at each pool's last pass
        self.locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.joined: dict[str, tuple[str, str]] = {}  # uid -> (namespace, pool) it was last applied into
        self.left: dict[str, float] = {}  # uid -> when (monotonic) a deleted member left its pool's ConfigMap
        self.moved: dict[str, tuple[float, str]] = {}  # uid -> when a member moved out of a pool, and which
        # A TLS Secret's name -> the keys it holds, as the members' passes last found them: the profiles of
        # every member are rebuilt with them (members share their Secrets), also when one leaves.
        self.tls_keys: dict[str, dict[str, Collection[str]]] = {}  # by namespace

    def forget(self, uid: str) -> None:
        self.joined.pop(uid, None)
        self.left.pop(uid, None)
        self.moved.pop(uid, None)

    async def sync(self, body: Mapping[str, Any], spec: ReplicationSpec,
                   tls_keys: Mapping[str, Collection[str]], resume_after: int | None) -> PoolOutcome | None:
        """The member's pass: its pool applied with it (None when it names no pool); a pool it left
        is applied without it."""
        meta = body["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        before = self.joined.get(uid)
        if before is not None and before != (namespace, spec.pool):
            self.moved[uid] = (await self._drop(before[0], before[1], body, uid), before[1])
            self.joined.pop(uid, None)
        if uid in self.moved:
            since, old = self.moved[uid]
            waited = time.monotonic() - since
            if waited < self.grace:
                where = f"it joins pool {spec.pool!r}" if spec.pool else "its own worker Deployment starts it"
                return PoolOutcome([st.Problem(st.POOL_HANDOVER, f"waiting {self.grace - waited:.0f} s more for "
                                               f"pool {old!r}'s workers to stop copying it before {where}")],
                                   waiting=True)  # the timer passes again: a problem it may fix
            self.moved.pop(uid)
        if spec.pool is None:
            return None
        stopping = await self._stop_own(body, spec)
        if stopping is not None:
            return stopping
        this = (_order(body), Member(spec, uid, resume_after))
        outcome = await self._apply(namespace, spec.pool, body, tls_keys, this)
        self.joined[uid] = (namespace, spec.pool)
        return outcome

    async def leave(self, body: Mapping[str, Any], spec: ReplicationSpec) -> str | None:
        """A deleted member: out of the ConfigMap (the pool deleted with its last member); what it still
        waits for before its durable consumer may go, or None."""
        meta = body["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        assert spec.pool is not None
        if uid not in self.left:
            try:
                self.left[uid] = await self._drop(namespace, spec.pool, body, uid)
            except APIError as err:
                return error_text(err)
            self.joined.pop(uid, None)
        name = naming.deployment_name(naming.pool_base(spec.pool))
        deployment = await self.api.get_quietly(naming.DEPLOYMENT, namespace, name)
        if deployment is not None and not self._in_pool(deployment, spec.pool):
            deployment = None
        if deployment is not None and deployment["metadata"].get("deletionTimestamp"):
            return f"waiting for Deployment {name}'s pods to stop (the pool's last member is going)"
        waited = time.monotonic() - self.left[uid]
        if deployment is not None and waited < self.grace:
            return (f"waiting {self.grace - waited:.0f} s more for pool {spec.pool!r}'s workers to reload its "
                    f"ConfigMap without this replication before deleting the durable consumer")
        return None

    async def _drop(self, namespace: str, pool: str, body: Mapping[str, Any], uid: str) -> float:
        """The pool applied without the member; from when (monotonic) its workers may still copy it
        (long ago if it never ran in the pool: refused). Raises APIError when the pool cannot be applied."""
        config = await self.api.get_quietly(naming.CONFIGMAP, namespace, naming.configmap_name(naming.pool_base(pool)))
        was_in = config is not None and naming.owned_by(config, uid)
        outcome = await self._apply(namespace, pool, body, None, None, leaving=uid)
        failed = [p.message for p in outcome.problems if p.reason == st.APPLY_FAILED]
        if failed:
            raise APIError(0, "; ".join(failed))
        return time.monotonic() if was_in else -self.grace

    async def _stop_own(self, body: Mapping[str, Any], spec: ReplicationSpec) -> PoolOutcome | None:
        """A member joining from pods of its own: their Deployment deleted in the foreground and gone
        first (None once it is)."""
        meta = body["metadata"]
        name = naming.deployment_name(meta["name"])
        own = await self.api.get_quietly(naming.DEPLOYMENT, meta["namespace"], name)
        if own is None or not naming.controlled_by(own, meta["uid"]):
            return None
        self.applier.desired.pop((naming.DEPLOYMENT.plural, meta["namespace"], name), None)  # not drift
        if not own["metadata"].get("deletionTimestamp"):
            try:
                await self.api.delete(naming.DEPLOYMENT, meta["namespace"], name, uid=own["metadata"].get("uid"),
                                      foreground=True)
            except APIError as err:
                return PoolOutcome([st.Problem(st.APPLY_FAILED, f"deleting Deployment {name}: {error_text(err)}")],
                                   retry=True, waiting=True)
            self.events.post(body, "Normal", "Deleted", f"deleted Deployment {name}: its pods stop before this "
                             f"replication joins pool {spec.pool!r}")
        return PoolOutcome([st.Problem(st.POOL_HANDOVER, f"waiting for Deployment {name}'s pods to stop before "
                                       f"joining pool {spec.pool!r}")], waiting=True)

    @staticmethod
    def _in_pool(obj: Mapping[str, Any], pool: str) -> bool:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(naming.LABEL_POOL) == pool

    async def _members(self, namespace: str, pool: str, this: tuple[tuple[str, str], Member] | None,
                       leaving: str | None, paused: set[str]) -> list[Member]:
        """The resources naming the pool, oldest first; the pass's own spec for its own resource.
        Adds the names of the paused ones to `paused`."""
        found: dict[str, tuple[tuple[str, str], Member]] = {}
        for body in await self.api.list(naming.STREAM_REPLICATION, namespace):
            meta = body.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if uid == leaving or meta.get("deletionTimestamp") or (body.get("spec") or {}).get("pool") != pool:
                continue
            if naming.paused(body):
                paused.add(str(meta.get("name")))
            try:
                spec = await connections.resolve(self.api, parse_spec(body))
            except (SpecError, connections.ConnectionUnusable):
                continue  # its own pass says why; it is not in the pool meanwhile
            found[uid] = (_order(body), Member(spec, uid, _resume_after(body)))
        if this is not None:
            found[this[1].uid] = this
        return [member for _, member in sorted(found.values(), key=lambda entry: entry[0])]

    async def _running(self, namespace: str, pool: str, members: list[Member]) -> dict[str, Mapping[str, Any]]:
        """The profiles the pool's ConfigMap holds now for members that own it (the same uid)."""
        live = await self.api.get_quietly(naming.CONFIGMAP, namespace, naming.configmap_name(naming.pool_base(pool)))
        if live is None or not self._in_pool(live, pool):
            return {}
        try:
            topics = (yaml.safe_load((live.get("data") or {}).get(naming.CONFIG_KEY) or "") or {}).get("topics") or {}
        except yaml.YAMLError:
            return {}  # edited by hand into something unreadable: nothing is kept, the pass rewrites it
        return {m.name: topics[m.name] for m in members if m.name in topics and naming.owned_by(live, m.uid)}

    async def _apply(self, namespace: str, pool: str, body: Mapping[str, Any],
                     tls_keys: Mapping[str, Collection[str]] | None, this: tuple[tuple[str, str], Member] | None,
                     leaving: str | None = None) -> PoolOutcome:
        outcome = PoolOutcome()
        known = self.tls_keys.setdefault(namespace, {})
        known.update(tls_keys or {})
        paused: set[str] = set()
        async with self.locks.setdefault((namespace, pool), asyncio.Lock()):
            try:
                members = await self._members(namespace, pool, this, leaving, paused)
            except APIError as err:
                outcome.problems.append(st.Problem(st.APPLY_FAILED, f"listing pool {pool!r}: {error_text(err)}"))
                outcome.retry = err.retryable
                return outcome
            running = await self._running(namespace, pool, members)
            built = build_pool(pool, members, self.worker_image, known, self.admitted, running, paused)
            for obj in built.objects:
                await self._put(body, pool, obj, outcome, built)
            for kind, name in built.absent:
                await self._remove(body, pool, kind, namespace, name, outcome)
            self._nudge_changed(namespace, pool, {m.name: built.refused.get(m.name) for m in members},
                                this[1].name if this else None)
        if this is not None and this[1].name in built.refused:
            reason, message = built.refused[this[1].name]
            outcome.problems.append(st.Problem(reason, message))
            outcome.deployment = None
        return outcome

    def _nudge_changed(self, namespace: str, pool: str, standing: Standing, own: str | None) -> None:
        """The other members whose standing this pass changed (refused by new pods, accepted again, or
        their settings owner gone) get a pass of their own: their status says so at once."""
        before = self.standing.get((namespace, pool), {})
        self.standing[(namespace, pool)] = standing
        for name, now in standing.items():
            if name != own and name in before and before[name] != now and self.nudge is not None:
                self.nudge(namespace, name)

    async def _put(self, body: Mapping[str, Any], pool: str, obj: dict[str, Any], outcome: PoolOutcome,
                   built: Pool) -> None:
        kind, meta = naming.kind_of(obj), obj["metadata"]
        label = f"{kind.kind} {meta['name']}"
        try:
            live = await self.api.get(kind, meta["namespace"], meta["name"])
            if live is not None and not self._in_pool(live, pool):
                outcome.problems.append(st.Problem(st.NAME_CONFLICT, f"{label} exists and is not pool {pool!r}'s"))
                return
            if kind is naming.DEPLOYMENT:
                obj = workload.safe_strategy(obj, live)
            self.applier.desired[(kind.plural, meta["namespace"], meta["name"])] = obj
            result = live
            if live is None:
                result = await self.api.apply(obj)
                self.events.post(body, "Normal", "Created", f"created {label} for pool {pool!r}")
            elif not contains(live, obj):
                result = await self.api.apply(obj)
                members = ", ".join(m.name for m in built.members)
                what = "its members' profiles (the workers reload them)" if kind is naming.CONFIGMAP else "it"
                self.events.post(body, "Normal", "Updated", f"updated {label} for pool {pool!r} ({members}): {what}")
            if kind is naming.DEPLOYMENT:
                outcome.deployment = result
        except APIError as err:
            self.applier.desired.pop((kind.plural, meta["namespace"], meta["name"]), None)
            outcome.problems.append(st.Problem(st.APPLY_FAILED, f"{label}: {error_text(err)}"))
            outcome.retry = outcome.retry or err.retryable

    async def _remove(self, body: Mapping[str, Any], pool: str, kind: naming.Kind, namespace: str, name: str,
                      outcome: PoolOutcome) -> None:
        self.applier.desired.pop((kind.plural, namespace, name), None)
        live = await self.api.get_quietly(kind, namespace, name)
        if live is None or not self._in_pool(live, pool) or live["metadata"].get("deletionTimestamp"):
            return
        try:
            await self.api.delete(kind, namespace, name, uid=live["metadata"].get("uid"),
                                  foreground=kind is naming.DEPLOYMENT)
            self.events.post(body, "Normal", "Deleted",
                             f"deleted {kind.kind} {name} (pool {pool!r} no longer needs it)")
        except APIError as err:
            outcome.problems.append(st.Problem(st.APPLY_FAILED, f"deleting {kind.kind} {name}: {error_text(err)}"))
            outcome.retry = True
