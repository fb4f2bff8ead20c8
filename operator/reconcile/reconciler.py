"""Level-based reconciliation: build every child, apply what differs, report status and events.

kopf handlers, child watch events and timers all end up here. Work on one resource is serialised
by a per-resource lock, and every pass recomputes everything from the spec, so the order in which
triggers arrive never matters. The only memory kept between passes is a cache (what was applied
last, the last problems and status) that makes child events cheap; a restart rebuilds it on resume.

The Reconciler composes the collaborators that act for it, each with one concern and shared with
the engine switch where both need it: `Events`, the `StatusWriter`, the `Applier` (children),
`Secrets` (checked and read under the policy) and the Kubernetes API (`KubeApi`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replication_operator.build.children import BuildOptions, Children, build_children
from replication_operator.checks import advice, connections, policy
from replication_operator.checks.secrets import Secrets
from replication_operator.engine import choice as engine
from replication_operator.engine.target import NativeError
from replication_operator.kube import APIError, KubeApi
from replication_operator.metrics import OperatorMetrics
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import ReplicationSpec, SpecError, parse_spec
from replication_operator.nats import connection, durables, probes
from replication_operator.reconcile.apply import Applier
from replication_operator.reconcile.engine_switch import EngineSwitch
from replication_operator.reconcile.events import Events
from replication_operator.reconcile.memory import Memory, asked
from replication_operator.reconcile.pool import Pools
from replication_operator.reconcile.status_writer import StatusWriter
from replication_operator.settings import OperatorConfig

from replicator.observe.monitor import MonitorServer

log = logging.getLogger("replication_operator")

# Problems that keep the operator from reading NATS for a resource (its Secrets are not usable).
NO_NATS_READS = frozenset({st.SECRET_MISSING, st.SECRET_KEY_MISSING, st.CONNECTION_MISSING, *policy.REASONS})


class WorkersRunning(Exception):
    """Finalizing waits for the worker pods to be gone."""


@dataclass
class Outcome:
    problems: list[st.Problem]
    retry: bool = False  # a transient API failure: worth retrying soon


class Reconciler:
    def __init__(self, config: OperatorConfig | None = None, api: KubeApi | None = None,
                 clock: Callable[[], dt.datetime] | None = None, metrics: OperatorMetrics | None = None) -> None:
        self.config = config or OperatorConfig()
        self.policy = self.config.make_policy()
        self.api = api or KubeApi()
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.metrics = metrics or OperatorMetrics()
        self.metrics_server: MonitorServer | None = None  # set when `/metrics` is served
        self.memory: dict[str, Memory] = {}
        self.events = Events()
        self.secrets = Secrets(self.api, self.policy)
        self.applier = Applier(self.api, self.events)
        self.status = StatusWriter(self.api, self.metrics, self.events, self.clock, self.config.certificate_warning)
        self.pools = Pools(self.api, self.applier, self.events, self.config.worker_image, self._policy_refusal,
                           self._nudge, self.config.pool_reload_grace)
        self._nudged: set[asyncio.Task[None]] = set()
        self.switch = EngineSwitch(self.api, self.secrets, self.events, self.status, self.clock,
                                   self.config.nats_timeout)

    # ---- bookkeeping ----
    def _memory(self, uid: str) -> Memory:
        if uid not in self.memory:
            self.memory[uid] = Memory()
        return self.memory[uid]

    def forget(self, uid: str) -> None:
        """The resource is gone: drop its memory, its metrics and its children's desired state."""
        memory = self.memory.pop(uid, None)
        if memory is not None:
            self.status.forget(memory)
        self.applier.forget(uid)
        self.pools.forget(uid)

    def _nudge(self, namespace: str, name: str) -> None:
        """Another pass of a pool member, soon (not under the lock of the pass that asks for it)."""
        task = asyncio.create_task(self._pass_again(namespace, name))
        self._nudged.add(task)
        task.add_done_callback(self._nudged.discard)

    async def _pass_again(self, namespace: str, name: str) -> None:
        try:
            owner = await self._owner(namespace, name)
            if owner is not None:
                await self.reconcile(owner, cause="pool")
        except Exception:  # a boundary: a task nobody awaits; its timer's pass comes anyway
            log.exception("another pass of pool member %s/%s failed", namespace, name)

    def _policy_refusal(self, spec: ReplicationSpec) -> tuple[str, str] | None:
        """The policy's first refusal of a pool member's spec (it is kept out of the pool)."""
        found = policy.check(spec, self.policy)
        return (found[0].reason, found[0].message) if found else None

    def _options(self, tls_keys: Mapping[str, frozenset[str]], resume_after: int | None = None) -> BuildOptions:
        return BuildOptions(
            worker_image=self.config.worker_image, spark_image=self.config.spark_image, tls_keys=tls_keys,
            resume_after=resume_after,
        )

    # ---- the pass ----
    async def reconcile(self, body: Mapping[str, Any], cause: str = "reconcile") -> Outcome:
        uid = body["metadata"]["uid"]
        memory = self._memory(uid)
        async with memory.lock:
            return await self._reconcile(body, memory, cause)

    async def _reconcile(self, body: Mapping[str, Any], memory: Memory, cause: str) -> Outcome:
        if naming.paused(body):  # nothing built, applied, switched or deleted; the status says so
            if memory.paused is not True:
                self.events.post(body, "Normal", st.PAUSED_BY_ANNOTATION,
                                 f"reconciliation paused by {naming.PAUSED_ANNOTATION}")
            memory.paused = True
            await self.status.write_paused(body, memory)
            return Outcome(memory.problems)
        if memory.paused:
            self.events.post(body, "Normal", "Resumed", f"{naming.PAUSED_ANNOTATION} removed: reconciling again")
        memory.paused = False
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        generation = meta.get("generation")
        problems: list[st.Problem] = []
        retry = False
        deployment: dict[str, Any] | None = None

        spec: ReplicationSpec | None = None
        try:
            spec, unusable = await connections.resolve_all(self.api, parse_spec(body))  # a connectionRef's fields
            problems.extend(unusable)
            if spec is not None:
                memory.advised = self.events.warn_new(body, memory.advised, tuple(advice.advise(spec)))
        except SpecError as err:
            problems.append(st.Problem(st.INVALID_SPEC, str(err)))

        children: Children | None = None
        pooled: tuple[Mapping[str, frozenset[str]], int | None] | None = None  # the pool's build inputs
        memory.engine.native_view = None
        if spec is not None:
            # The policy first: a refused resource builds and changes nothing, its children stay.
            problems.extend(st.Problem(v.reason, v.message) for v in policy.check(spec, self.policy))
            secret_problems, tls_keys, memory.certificates = await self.secrets.check(spec)
            problems.extend(secret_problems)
            if not problems:
                choice = await self.switch.choose(body, spec, memory)
                if choice.problem:
                    problems.append(st.Problem(choice.reason, choice.message))
                elif choice.engine == engine.NATIVE:
                    self.applier.forget(uid)  # no child is wanted: their deletion is not drift
                    outcome = await self.switch.run(body, spec, memory)
                    problems.extend(outcome.problems)
                    retry = outcome.retry
                    memory.engine.native_view = outcome.view
                else:
                    handover, resume_after = await self.switch.leave(body, spec, memory)
                    problems.extend(handover)
                    if not handover:
                        try:
                            children = build_children(spec, self._options(tls_keys, resume_after))
                            pooled = (tls_keys, resume_after)
                        except SpecError as err:
                            problems.append(st.Problem(st.INVALID_SPEC, str(err)))

        pool = None
        if spec is not None and pooled is not None:  # a pool member's pods, or a pool it moved out of
            pool = await self.pools.sync(body, spec, *pooled)
            if pool is not None:
                problems.extend(pool.problems)
                retry = pool.retry
                children = None if pool.waiting else children  # a handover: its new home waits
        if children is not None:
            applied = await self.applier.apply(body, children, cause)
            problems.extend(applied.problems)
            deployment, retry = applied.deployment, retry or applied.retry
            if pool is not None:
                deployment = pool.deployment
            if memory.current_status(body).get("engine") != engine.REPLICATOR:
                with contextlib.suppress(APIError):  # written with the rest of the status otherwise
                    await self.status.persist(body, memory, {"engine": engine.REPLICATOR})
        if deployment is None and memory.engine.native_view is None and not (spec and spec.pool):
            live = await self.api.get_quietly(naming.DEPLOYMENT, namespace, naming.deployment_name(name))
            deployment = live if live and naming.controlled_by(live, uid) else None

        memory.problems = problems
        memory.observed_generation = generation
        memory.last_full = time.monotonic()
        self._post_problems(body, memory, problems)
        await self.status.write(body, memory, deployment, asked(body).replicas)
        return Outcome(problems, retry)

    def _post_problems(self, body: Mapping[str, Any], memory: Memory, problems: list[st.Problem]) -> None:
        """A Warning event per new problem; one Normal event when they are all gone."""
        current = tuple((p.reason, p.message) for p in problems)
        if current == memory.posted:
            return
        self.events.warn_new(body, memory.posted, current)
        if not current and memory.posted:
            self.events.post(body, "Normal", "Recovered", "all problems are resolved")
        memory.posted = current

    # ---- triggers besides the resource's own handlers ----
    async def _owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        owner = await self.api.get_quietly(naming.STREAM_REPLICATION, namespace, name)
        if owner is None or owner["metadata"].get("deletionTimestamp"):
            return None
        return owner

    async def on_child_event(self, event_type: str, child: Mapping[str, Any]) -> None:
        """A child changed: restore it if deleted or edited; refresh status when it is the Deployment."""
        meta = child.get("metadata") or {}
        if naming.LABEL_POOL in (meta.get("labels") or {}):
            await self._on_pool_child(event_type, child)
            return
        refs = [r for r in meta.get("ownerReferences") or []
                if r.get("kind") == naming.KIND and r.get("controller")
                and str(r.get("apiVersion", "")).startswith(naming.GROUP + "/")]
        if not refs or not meta.get("namespace"):
            return
        owner_name, owner_uid = refs[0]["name"], refs[0].get("uid")
        drifted = self.applier.drifted(event_type, child)
        is_deployment = child.get("kind") == "Deployment" and event_type != "DELETED"
        memory = self.memory.get(owner_uid)
        # Switching to native: the Deployment's deletion (its pods are gone) is the next step.
        handover = (memory is not None and memory.engine.awaiting_pods and child.get("kind") == "Deployment"
                    and event_type == "DELETED")
        if memory is not None and memory.engine.native_view is not None and not handover:
            return  # native engine: no pods to follow, and no child is wanted
        if not drifted and not is_deployment and not handover:
            return
        if owner_uid not in self.memory:
            return  # not reconciled by this process yet: its resume handler will cover it
        owner = await self._owner(meta["namespace"], owner_name)
        if owner is None or owner["metadata"]["uid"] != owner_uid or naming.paused(owner):
            return  # gone, or paused: a deleted or edited child stays as it is
        if drifted or handover:
            await self.reconcile(owner, cause="drift")
        else:
            memory = self._memory(owner_uid)
            async with memory.lock:
                await self.status.write(owner, memory, child, asked(owner).replicas)

    async def _on_pool_child(self, event_type: str, child: Mapping[str, Any]) -> None:
        """A pool's object changed: one member's pass repairs drift; the Deployment's progress is every
        member's status."""
        meta = child.get("metadata") or {}
        drifted = self.applier.drifted(event_type, child)
        if not drifted and (child.get("kind") != "Deployment" or event_type == "DELETED"):
            return
        for ref in [r for r in meta.get("ownerReferences") or [] if r.get("kind") == naming.KIND]:
            memory = self.memory.get(str(ref.get("uid")))
            owner = await self._owner(meta["namespace"], ref["name"]) if memory is not None else None
            if memory is None or owner is None or owner["metadata"]["uid"] != ref.get("uid") or naming.paused(owner):
                continue
            if drifted:
                await self.reconcile(owner, cause="drift")
                return
            async with memory.lock:
                await self.status.write(owner, memory, child, asked(owner).replicas)

    async def tick(self, body: Mapping[str, Any]) -> None:
        """The timer: re-check problems and resync now and then, then read NATS."""
        uid = body["metadata"]["uid"]
        memory = self._memory(uid)
        if naming.paused(body) or memory.paused:  # the pass writes the paused status, or resumes
            await self.reconcile(body, cause="resync")
            return
        stale = time.monotonic() - memory.last_full >= self.config.resync_interval
        fixable = any(p.reason != st.INVALID_SPEC for p in memory.problems)
        if stale or fixable or memory.engine.awaiting_pods:
            await self.reconcile(body, cause="resync")
        await self.refresh_nats(body)

    async def refresh_nats(self, body: Mapping[str, Any]) -> None:
        """status.lag, status.lastActive and status.fleet from the source consumer and the fleet KV."""
        try:
            spec = await connections.resolve(self.api, parse_spec(body))
        except (SpecError, connections.ConnectionUnusable):
            return
        memory = self._memory(body["metadata"]["uid"])
        if any(p.reason in NO_NATS_READS for p in memory.problems) or policy.check(spec, self.policy):
            return  # a refused resource is not read either: no connection to a host it may not name
        in_charge = memory.current_status(body).get("engine")
        if memory.engine.native_view is not None or in_charge == engine.NATIVE:
            retired = await self._retire_durable(body, spec, memory, None)
            if retired:
                async with memory.lock:
                    await self.status.update(body, memory, retired)
            await self._refresh_native(body, spec, memory)
            return
        fields: dict[str, Any] = {}
        timeout = self.config.nats_timeout
        try:
            auth = await self.secrets.auth(spec, spec.source)
            fields.update(await probes.read_consumer(spec, auth, timeout))
            fields.update(await self._retire_durable(body, spec, memory, spec.consumer_name))
            conditions = self._loop_conditions(body, memory, fields.pop(probes.LOOPS, ""))
            if conditions is not None:
                fields["conditions"] = conditions
            self._nats_ok(body, memory, "lag")
        except connection.NatsStatusError as err:
            self._nats_error(body, memory, "lag", "LagUnavailable", str(err))
        if spec.fleet_health and spec.advisory_endpoint:
            try:
                auth = await self.secrets.auth(spec, spec.advisory_endpoint)
                summary = await probes.read_fleet(spec, auth, timeout)
                fields["fleet"] = summary.status
                memory.fleet_sites = summary.sites
                self._nats_ok(body, memory, "fleet")
            except connection.NatsStatusError as err:
                self._nats_error(body, memory, "fleet", "FleetUnavailable", str(err))
        if fields:
            async with memory.lock:
                await self.status.update(body, memory, fields)

    async def _refresh_native(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory) -> None:
        """Native engine: the target stream's view of our entry; drift (entry gone or edited) is
        repaired at once."""
        try:
            intact = await self.switch.refresh(body, spec, memory)
            self._nats_ok(body, memory, "lag")
        except (connection.NatsStatusError, NativeError) as err:
            self._nats_error(body, memory, "lag", "LagUnavailable", str(err))
            return
        if not intact:
            await self.reconcile(body, cause="drift")
            return
        async with memory.lock:
            await self.status.write(body, memory, None, 0)

    async def finalize(self, body: Mapping[str, Any]) -> None:
        """The resource is being deleted: the native engine's entry goes (stream and data stay); the
        replicator's durable on the source goes once its pods are gone (a running worker would
        create it again). Raises WorkersRunning while they stop."""
        spec = parse_spec(body)
        try:
            spec = await connections.resolve(self.api, spec)
        except connections.ConnectionUnusable as err:
            raise connection.NatsStatusError(str(err)) from None
        if (body.get("status") or {}).get("native"):
            done = await self.switch.remove(body, spec)
            if done:
                self.events.post(body, "Normal", "SourceRemoved", done)
            return
        meta = body["metadata"]
        if spec.pool:  # its pods are the pool's: they stop copying it once they reload the ConfigMap without it
            waiting = await self.pools.leave(body, spec)
            if waiting:
                raise WorkersRunning(waiting)
        name = naming.deployment_name(meta["name"])
        deployment = None if spec.pool else await self.api.get_quietly(naming.DEPLOYMENT, meta["namespace"], name)
        if deployment is not None:
            if not (deployment.get("metadata") or {}).get("deletionTimestamp"):
                await self.api.delete(naming.DEPLOYMENT, meta["namespace"], name,
                                      uid=(deployment.get("metadata") or {}).get("uid"), foreground=True)
            raise WorkersRunning(f"waiting for Deployment {name}'s pods to stop before deleting the durable consumer")
        auth = await self.secrets.auth(spec, spec.source)
        deleted = await durables.delete_durable(spec, spec.consumer_name, auth, self.config.nats_timeout)
        if deleted:
            self.events.post(body, "Normal", "DurableDeleted", f"deleted {deleted}")

    async def _retire_durable(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory,
                              wanted: str | None) -> dict[str, Any]:
        """status.consumer follows the durable in use (`wanted`: None under the native engine). One
        left by a change of mode, name or engine is deleted on the source once no pod can use it
        (a stopping ordered worker parks its durable again); {} while it waits or cannot."""
        recorded = memory.current_status(body).get("consumer")
        if recorded == wanted or (recorded is None and wanted is None):
            return {}
        if recorded is None:
            return {"consumer": wanted}
        meta = body["metadata"]
        deployment = await self.api.get_quietly(naming.DEPLOYMENT, meta["namespace"],
                                                naming.deployment_name(meta["name"]))
        if wanted is None and deployment is not None:
            return {}  # the replicator's pods are still stopping
        if wanted is not None and not st.rollout_of(deployment, asked(body).replicas).complete:
            return {}  # pods of the previous config may still run
        try:
            auth = await self.secrets.auth(spec, spec.source)
            deleted = await durables.delete_durable(spec, recorded, auth, self.config.nats_timeout)
        except connection.NatsStatusError as err:
            self._nats_error(body, memory, "durable", "DurableLeft", f"previous durable {recorded} left on the "
                             f"source (delete it with nats consumer rm): {err}")
            # The native engine may not reach the source at all: tried once. The replicator just read it.
            return {"consumer": None} if wanted is None else {}
        memory.nats_errors.pop("durable", None)
        if deleted:
            self.events.post(body, "Normal", "DurableDeleted", f"deleted {deleted}: no longer used (now "
                             f"{'the native engine' if wanted is None else wanted})")
        return {"consumer": wanted}

    def _loop_conditions(self, body: Mapping[str, Any], memory: Memory, note: str) -> list[dict[str, Any]] | None:
        """The conditions with CopyLoop from the workers' notes on their consumer (None: unchanged;
        every later status write keeps it); a Warning event when a refusal appears."""
        if (memory.copy_loop is None and not note) or note == memory.copy_loop:
            return None
        if "refused" in note:
            self.events.post(body, "Warning", st.LOOP_REFUSED, note)
        memory.copy_loop = note
        old = memory.current_status(body).get("conditions") or []
        cond = st.loop_condition(note, memory.observed_generation)
        assert cond is not None
        merged = st.merge_conditions(old, [cond], self.status.clock())
        return [c for c in old if c.get("type") != st.COPY_LOOP] + merged

    def _nats_error(
        self, body: Mapping[str, Any], memory: Memory, what: str, reason: str, message: str
    ) -> None:
        if memory.nats_errors.get(what) != message:
            memory.nats_errors[what] = message
            self.events.post(body, "Warning", reason, message)

    def _nats_ok(self, body: Mapping[str, Any], memory: Memory, what: str) -> None:
        if memory.nats_errors.pop(what, None) is not None:
            self.events.post(body, "Normal", "LagAvailable" if what == "lag" else "FleetAvailable",
                             f"reading {what} again")

