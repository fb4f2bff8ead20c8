"""Level-based reconciliation: build every child, apply what differs, report status and events.

kopf handlers, child watch events and timers all end up here. Work on one resource is serialised
by a per-resource lock, and every pass recomputes everything from the spec, so the order in which
triggers arrive never matters. The only memory kept between passes is a cache (what was applied
last, the last problems and status) that makes child events cheap; a restart rebuilds it on resume.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from replication_operator.build import spark_application
from replication_operator.build import workload as builders
from replication_operator.build.children import BuildOptions, Children, build_children
from replication_operator.build.workload import contains
from replication_operator.checks import advice, policy
from replication_operator.checks import secrets as secret_checks
from replication_operator.checks.certificates import certificate_event
from replication_operator.engine import choice as engine
from replication_operator.engine.target import NativeError
from replication_operator.kube import APIError, APINotFoundError, KubeApi, error_text
from replication_operator.metrics import OperatorMetrics
from replication_operator.model import images, naming
from replication_operator.model import status as st
from replication_operator.model.naming import controlled_by
from replication_operator.model.spec import Endpoint, ReplicationSpec, SpecError, parse_spec
from replication_operator.nats import connection, probes
from replication_operator.reconcile.engine_switch import NativeEngine
from replication_operator.reconcile.memory import Memory

from replicator.config.durations import parse_duration
from replicator.observe.monitor import MonitorServer

log = logging.getLogger("replication_operator")

OPTIONAL_KINDS = (naming.SERVICE_MONITOR, naming.SCHEDULED_SPARK_APPLICATION)
# Problems that keep the operator from reading NATS for a resource (its Secrets are not usable).
NO_NATS_READS = frozenset({st.SECRET_MISSING, st.SECRET_KEY_MISSING, *policy.REASONS})
ChildKey = tuple[str, str, str]  # (plural, namespace, name)


# Policy settings: (field, environment variable); `main.py` adds a flag for each.
POLICY_ENV = (
    ("allowed_images", "STREAM_REPLICATOR_ALLOWED_IMAGES"),
    ("allowed_service_accounts", "STREAM_REPLICATOR_ALLOWED_SERVICE_ACCOUNTS"),
    ("unlabelled_secrets_namespaces", "STREAM_REPLICATOR_UNLABELLED_SECRETS_NAMESPACES"),
    ("allowed_nats_hosts", "STREAM_REPLICATOR_ALLOWED_NATS_HOSTS"),
    ("allowed_spark_conf", "STREAM_REPLICATOR_ALLOWED_SPARK_CONF"),
    ("allowed_spark_packages", "STREAM_REPLICATOR_ALLOWED_SPARK_PACKAGES"),
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
    # The tenancy policy (operator/policy.py): secure by default, except NATS hosts (any).
    allowed_images: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    unlabelled_secrets_namespaces: tuple[str, ...] = ()
    allowed_nats_hosts: tuple[str, ...] = policy.ANY_HOST
    allowed_spark_conf: tuple[str, ...] = policy.DEFAULT_SPARK_CONF
    allowed_spark_packages: tuple[str, ...] = policy.DEFAULT_SPARK_PACKAGES
    # No cluster-scoped API calls (kopf neither lists namespaces nor watches CRDs): RBAC by Roles only.
    roles_only: bool = False
    certificate_warning: float = 14 * 86400.0  # warn when a mounted certificate expires sooner

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
        )


@dataclass
class Outcome:
    problems: list[st.Problem]
    retry: bool = False  # a transient API failure: worth retrying soon


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
        self.desired: dict[ChildKey, dict[str, Any]] = {}
        self.native = NativeEngine(self)

    # ---- bookkeeping ----
    def _memory(self, uid: str) -> Memory:
        if uid not in self.memory:
            self.memory[uid] = Memory()
        return self.memory[uid]

    def forget(self, uid: str) -> None:
        """The resource is gone: drop its memory, its metrics and its children's desired state."""
        memory = self.memory.pop(uid, None)
        if memory is not None and memory.identity is not None:
            self.metrics.forget(*memory.identity)
        self.forget_children(uid)

    def forget_children(self, uid: str) -> None:
        """Its children are no longer wanted (native engine): a deletion is not drift."""
        for key in [k for k, v in self.desired.items() if controlled_by(v, uid)]:
            self.desired.pop(key, None)

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
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        generation = meta.get("generation")
        problems: list[st.Problem] = []
        retry = False
        deployment: dict[str, Any] | None = None
        desired_replicas = int((body.get("spec") or {}).get("replicas", 1) or 0)

        spec: ReplicationSpec | None = None
        try:
            spec = parse_spec(body)
            desired_replicas = spec.replicas
            self._advise(body, memory, spec)
        except SpecError as err:
            problems.append(st.Problem(st.INVALID_SPEC, str(err)))

        children: Children | None = None
        memory.native_view = None
        if spec is not None:
            # The policy first: a refused resource builds and changes nothing, its children stay.
            problems.extend(st.Problem(v.reason, v.message) for v in policy.check(spec, self.policy))
            secret_problems, tls_keys, memory.certificates = await self._check_secrets(spec)
            problems.extend(secret_problems)
            if not problems:
                choice = await self.native.choose(body, spec, memory)
                if choice.problem:
                    problems.append(st.Problem(choice.reason, choice.message))
                elif choice.engine == engine.NATIVE:
                    outcome = await self.native.run(body, spec, memory)
                    problems.extend(outcome.problems)
                    retry = outcome.retry
                    memory.native_view = outcome.view
                else:
                    handover, resume_after = await self.native.leave(body, spec, memory)
                    problems.extend(handover)
                    if not handover:
                        try:
                            children = build_children(body, self._options(tls_keys, resume_after))
                        except SpecError as err:
                            problems.append(st.Problem(st.INVALID_SPEC, str(err)))

        if children is not None:
            apply_problems, deployment, retry = await self._apply(body, children, cause)
            problems.extend(apply_problems)
            if (memory.status or body.get("status") or {}).get("engine") != engine.REPLICATOR:
                with contextlib.suppress(APIError):  # written with the rest of the status otherwise
                    await self._persist(body, memory, {"engine": engine.REPLICATOR})
        if deployment is None and memory.native_view is None:
            live = await self._get_quietly(naming.DEPLOYMENT, namespace, naming.deployment_name(name))
            deployment = live if live and controlled_by(live, uid) else None

        memory.problems = problems
        memory.observed_generation = generation
        memory.last_full = time.monotonic()
        self._post_problems(body, memory, problems)
        await self._write_status(body, memory, deployment, desired_replicas)
        return Outcome(problems, retry)

    async def _get_quietly(self, kind: naming.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.get(kind, namespace, name)
        except (APIError, TimeoutError) as err:
            log.warning("cannot read %s %s/%s: %s", kind.kind, namespace, name, error_text(err))
            return None

    async def _check_secrets(self, spec: ReplicationSpec) -> secret_checks.SecretCheck:
        return await secret_checks.check_secrets(self.api, self.policy, spec)

    async def _apply(
        self, body: Mapping[str, Any], children: Children, cause: str
    ) -> tuple[list[st.Problem], dict[str, Any] | None, bool]:
        meta = body["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        owner = kopf.Body(dict(body))  # type: ignore[arg-type]
        problems: list[st.Problem] = []
        deployment: dict[str, Any] | None = None
        retry = False
        for obj in children.objects:
            kind = naming.kind_of(obj)
            kopf.adopt(obj, owner=owner)
            name = obj["metadata"]["name"]
            label = f"{kind.kind} {name}"
            try:
                live = await self.api.get(kind, namespace, name)
                if live is not None and not controlled_by(live, uid):
                    problems.append(st.Problem(
                        st.NAME_CONFLICT, f"{label} exists and is not owned by this StreamReplication"))
                    continue
                if kind is naming.DEPLOYMENT:
                    obj = builders.safe_strategy(obj, live)
                key = _key(obj)
                known = self.desired.get(key)
                self.desired[key] = obj  # before the write: the watch event it causes must match
                if live is None:
                    result = await self.api.apply(obj)
                    if known is not None and cause != "create":
                        self._event(body, "Normal", "Restored", f"re-created {label} (it was deleted)")
                    else:
                        self._event(body, "Normal", "Created", f"created {label}")
                elif not contains(live, obj):
                    result = await self.api.apply(obj)
                    self._event(body, "Normal", *self._update_reason(label, live, obj, known))
                else:
                    result = live
                if kind is naming.DEPLOYMENT:
                    deployment = result
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
                retry = retry or err.status >= 500 or err.status in (0, 409, 429)
            except TimeoutError as err:
                self.desired.pop(_key(obj), None)
                problems.append(st.Problem(st.APPLY_FAILED, f"{label}: {error_text(err)}"))
                retry = True
        for kind, name in children.absent:
            self.desired.pop((kind.plural, namespace, name), None)
            live = await self._get_quietly(kind, namespace, name)
            if live is not None and controlled_by(live, uid):
                try:
                    await self.api.delete(kind, namespace, name, uid=live["metadata"].get("uid"))
                    self._event(body, "Normal", "Deleted", f"deleted {kind.kind} {name} (no longer needed)")
                except (APIError, TimeoutError) as err:
                    problems.append(st.Problem(
                        st.APPLY_FAILED, f"deleting {kind.kind} {name}: {error_text(err)}"))
                    retry = True
        return problems, deployment, retry

    @staticmethod
    def _update_reason(label: str, live: Mapping[str, Any], obj: Mapping[str, Any],
                       known: Mapping[str, Any] | None) -> tuple[str, str]:
        before, after = _hash_of(live), _hash_of(obj)
        if before != after:
            return "Updated", f"updated {label}: config hash {before} -> {after}, rolling the pods"
        if known is not None and contains(known, obj) and contains(obj, known):
            return "Reverted", f"put back {label} (changed outside the operator)"
        return "Updated", f"updated {label}"

    # ---- status and events ----
    def _event(self, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            kopf.event(body, type=kind, reason=reason, message=message)  # type: ignore[arg-type]
        except LookupError:  # outside an operator (unit tests, tools): log only
            pass
        level = logging.WARNING if kind == "Warning" else logging.INFO
        meta = body["metadata"]
        log.log(level, "%s/%s: %s: %s", meta.get("namespace"), meta.get("name"), reason, message)

    def _advise(self, body: Mapping[str, Any], memory: Memory, spec: ReplicationSpec) -> None:
        """A Warning event per new piece of advice about a spec that is built anyway."""
        current = tuple(advice.advise(spec))
        for reason, message in current:
            if (reason, message) not in memory.advised:
                self._event(body, "Warning", reason, message)
        memory.advised = current

    def _post_problems(self, body: Mapping[str, Any], memory: Memory, problems: list[st.Problem]) -> None:
        """A Warning event per new problem; one Normal event when they are all gone."""
        current = tuple((p.reason, p.message) for p in problems)
        if current == memory.posted:
            return
        for reason, message in current:
            if (reason, message) not in memory.posted:
                self._event(body, "Warning", reason, message)
        if not current and memory.posted:
            self._event(body, "Normal", "Recovered", "all problems are resolved")
        memory.posted = current

    async def _write_status(self, body: Mapping[str, Any], memory: Memory,
                            deployment: Mapping[str, Any] | None, desired_replicas: int) -> None:
        meta = body["metadata"]
        old = memory.status or dict(body.get("status") or {})
        extra = [engine.condition(memory.choice, memory.choice_generation)] if memory.choice else []
        now = self.clock()
        certificates = None  # the native engine mounts nothing
        if memory.native_view is None:
            certificates = st.certificate_condition(
                memory.certificates, now, dt.timedelta(seconds=self.config.certificate_warning),
                memory.observed_generation)
        new = st.build_status(
            name=meta["name"],
            generation=memory.observed_generation,
            problems=memory.problems,
            deployment=deployment,
            desired_replicas=desired_replicas,
            old_status=old,
            now=now,
            native=memory.native_view,
            extra_conditions=extra,
            certificates=certificates,
        )
        if memory.native_view is not None:
            new.update(memory.native_fields)
        memory.certificate_warning, event = certificate_event(certificates, memory.certificate_warning)
        if event is not None:
            self._event(body, *event)
        await self._patch_status(body, memory, old, new)

    async def _persist(self, body: Mapping[str, Any], memory: Memory, fields: Mapping[str, Any]) -> None:
        """Write these status fields now (an engine switch's step); None removes a field. Raises
        when they cannot be written: the next step must not run without them."""
        meta = body["metadata"]
        old = memory.status or dict(body.get("status") or {})
        patch = st.status_patch(old, fields)
        if patch:
            await self.api.patch_status(naming.STREAM_REPLICATION, meta["namespace"], meta["name"], patch)
        memory.status = {k: v for k, v in {**old, **fields}.items() if v is not None}

    async def _patch_status(self, body: Mapping[str, Any], memory: Memory,
                            old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        patch = st.status_patch(old, new)
        memory.status = {**old, **new}
        memory.identity = self.metrics.export(body, memory.status, parse_spec_replicas(body), memory.fleet_sites)
        if not patch:
            return
        meta = body["metadata"]
        try:
            await self.api.patch_status(naming.STREAM_REPLICATION, meta["namespace"], meta["name"], patch)
        except APINotFoundError:
            return  # deleted meanwhile
        except (APIError, TimeoutError) as err:
            memory.status = dict(old)  # not written: try again next time
            log.warning("%s/%s: cannot write status: %s", meta["namespace"], meta["name"], error_text(err))

    # ---- triggers besides the resource's own handlers ----
    async def _owner(self, namespace: str, name: str) -> dict[str, Any] | None:
        owner = await self._get_quietly(naming.STREAM_REPLICATION, namespace, name)
        if owner is None or owner["metadata"].get("deletionTimestamp"):
            return None
        return owner

    async def on_child_event(self, event_type: str, child: Mapping[str, Any]) -> None:
        """A child changed: restore it if deleted or edited; refresh status when it is the Deployment."""
        meta = child.get("metadata") or {}
        refs = [r for r in meta.get("ownerReferences") or []
                if r.get("kind") == naming.KIND and r.get("controller")
                and str(r.get("apiVersion", "")).startswith(naming.GROUP + "/")]
        if not refs or not meta.get("namespace"):
            return
        owner_name, owner_uid = refs[0]["name"], refs[0].get("uid")
        key = (naming.kind_of(dict(child)).plural, meta["namespace"], meta["name"])
        desired = self.desired.get(key)
        drifted = desired is not None and (event_type == "DELETED" or not contains(child, desired))
        is_deployment = child.get("kind") == "Deployment" and event_type != "DELETED"
        memory = self.memory.get(owner_uid)
        # Switching to native: the Deployment's deletion (its pods are gone) is the next step.
        handover = (memory is not None and memory.awaiting_pods and child.get("kind") == "Deployment"
                    and event_type == "DELETED")
        if memory is not None and memory.native_view is not None and not handover:
            return  # native engine: no pods to follow, and no child is wanted
        if not drifted and not is_deployment and not handover:
            return
        if owner_uid not in self.memory:
            return  # not reconciled by this process yet: its resume handler will cover it
        owner = await self._owner(meta["namespace"], owner_name)
        if owner is None or owner["metadata"]["uid"] != owner_uid:
            return
        if drifted or handover:
            await self.reconcile(owner, cause="drift")
        else:
            memory = self._memory(owner_uid)
            async with memory.lock:
                await self._write_status(owner, memory, child, int(
                    parse_spec_replicas(owner)))

    async def tick(self, body: Mapping[str, Any]) -> None:
        """The timer: re-check problems and resync now and then, then read NATS."""
        uid = body["metadata"]["uid"]
        memory = self._memory(uid)
        stale = time.monotonic() - memory.last_full >= self.config.resync_interval
        fixable = any(p.reason != st.INVALID_SPEC for p in memory.problems)
        if stale or fixable or memory.awaiting_pods:
            await self.reconcile(body, cause="resync")
        await self.refresh_nats(body)

    async def refresh_nats(self, body: Mapping[str, Any]) -> None:
        """status.lag, status.lastActive and status.fleet from the source consumer and the fleet KV."""
        try:
            spec = parse_spec(body)
        except SpecError:
            return
        memory = self._memory(body["metadata"]["uid"])
        if any(p.reason in NO_NATS_READS for p in memory.problems) or policy.check(spec, self.policy):
            return  # a refused resource is not read either: no connection to a host it may not name
        in_charge = (memory.status or body.get("status") or {}).get("engine")
        if memory.native_view is not None or in_charge == engine.NATIVE:
            await self._refresh_native(body, spec, memory)
            return
        fields: dict[str, Any] = {}
        timeout = self.config.nats_timeout
        try:
            auth = await self._auth(spec, spec.source)
            fields.update(await probes.read_consumer(spec, auth, timeout))
            self._nats_ok(body, memory, "lag")
        except connection.NatsStatusError as err:
            self._nats_error(body, memory, "lag", "LagUnavailable", str(err))
        if spec.fleet_health and spec.advisory_endpoint:
            try:
                auth = await self._auth(spec, spec.advisory_endpoint)
                summary = await probes.read_fleet(spec, auth, timeout)
                fields["fleet"] = summary.status
                memory.fleet_sites = summary.sites
                self._nats_ok(body, memory, "fleet")
            except connection.NatsStatusError as err:
                self._nats_error(body, memory, "fleet", "FleetUnavailable", str(err))
        if fields:
            async with memory.lock:
                old = memory.status or dict(body.get("status") or {})
                await self._patch_status(body, memory, old, fields)

    async def _refresh_native(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory) -> None:
        """Native engine: the target stream's view of our entry; drift (entry gone or edited) is
        repaired at once."""
        try:
            intact = await self.native.refresh(body, spec, memory)
            self._nats_ok(body, memory, "lag")
        except (connection.NatsStatusError, NativeError) as err:
            self._nats_error(body, memory, "lag", "LagUnavailable", str(err))
            return
        if not intact:
            await self.reconcile(body, cause="drift")
            return
        async with memory.lock:
            await self._write_status(body, memory, None, 0)

    async def finalize(self, body: Mapping[str, Any]) -> None:
        """The resource is being deleted: the native engine's entry goes (stream and data stay)."""
        if not (body.get("status") or {}).get("native"):
            return
        spec = parse_spec(body)
        done = await self.native.remove(body, spec)
        if done:
            self._event(body, "Normal", "SourceRemoved", done)

    async def _auth(self, spec: ReplicationSpec, endpoint: Endpoint) -> connection.Auth:
        """One side's NATS material from its Secrets, read now (the status probe, the native engine)."""
        return await secret_checks.read_auth(self.api, self.policy, spec, endpoint)

    def _nats_error(
        self, body: Mapping[str, Any], memory: Memory, what: str, reason: str, message: str
    ) -> None:
        if memory.nats_errors.get(what) != message:
            memory.nats_errors[what] = message
            self._event(body, "Warning", reason, message)

    def _nats_ok(self, body: Mapping[str, Any], memory: Memory, what: str) -> None:
        if memory.nats_errors.pop(what, None) is not None:
            self._event(body, "Normal", "LagAvailable" if what == "lag" else "FleetAvailable",
                        f"reading {what} again")


def parse_spec_replicas(body: Mapping[str, Any]) -> int:
    try:
        return parse_spec(body).replicas
    except SpecError:
        return int((body.get("spec") or {}).get("replicas", 1) or 0)
