"""Status of a StreamReplication: conditions (metav1.Condition shape) from what the operator saw.

Pure: the reconciler gathers the problems and the live Deployment; this module decides what the
user reads in `kubectl get srep` and `kubectl describe`. `lastTransitionTime` only moves when a
condition's status flips, so it tells how long a state has lasted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replication_operator.model import naming

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CERTIFICATES_EXPIRING = "CertificatesExpiring"  # only when the resource mounts TLS Secrets
# kstatus's pair (Flux, kpt, `kubectl wait`): derived from the three above (`kstatus_conditions`).
RECONCILING = "Reconciling"  # True while the operator is still applying the spec
STALLED = "Stalled"  # True for a problem that only a change by a person fixes
PAUSED = "Paused"  # only while the pause annotation is set (naming.PAUSED_ANNOTATION)

# Reasons (CamelCase) and what they mean; docs/operator.md (Status) lists them for users.
SECRET_MISSING = "SecretMissing"  # a referenced Secret does not exist
SECRET_KEY_MISSING = "SecretKeyMissing"  # the Secret exists, a referenced key does not
CONNECTION_MISSING = "ConnectionMissing"  # a NatsConnection named by connectionRef does not exist
INVALID_SPEC = "InvalidSpec"  # the spec cannot become a valid worker config
NAME_CONFLICT = "NameConflict"  # a child's name is taken by an object this resource does not own
CRD_MISSING = "CRDMissing"  # ServiceMonitor / ScheduledSparkApplication asked for, kind not served
APPLY_FAILED = "ApplyFailed"  # the API refused a child
ROLLOUT_STUCK = "RolloutStuck"  # the Deployment exceeded its progress deadline
POOL_MISMATCH = "PoolMismatch"  # spec.pool names a pool whose pods this resource's settings do not match
POOL_HANDOVER = "PoolHandover"  # joining or leaving a pool: the workers it left stop copying it first
PODS_UNAVAILABLE = "PodsUnavailable"  # rolled out, but fewer pods ready than desired
HEALTHY = "Healthy"
BLOCKED = "Blocked"
CREATING = "Creating"
ROLLING_OUT = "RollingOut"
ROLLOUT_COMPLETE = "RolloutComplete"
REPLICATING = "Replicating"
PODS_NOT_READY = "PodsNotReady"
SCALED_TO_ZERO = "ScaledToZero"
# The native engine (a source entry on the target stream, copied by NATS).
SOURCING = "Sourcing"  # Ready: NATS copies through our entry and reports no error
SOURCE_CONFIGURED = "SourceConfigured"  # Progressing: the entry is as the spec says
SOURCE_ERROR = "SourceError"  # NATS reports an error for our entry (Ready False, Degraded)
STOPPING_REPLICATOR = "StoppingReplicator"  # switching to native: waiting for the pods to be gone
SOURCE_RECREATED = "SourceRecreated"  # condition: the source stream was created again and the entry reset
REPAIRED = "Repaired"
PAUSED_BY_ANNOTATION = "PausedByAnnotation"
RETRYING = "Retrying"  # Stalled False: a problem the operator retries by itself
CERTIFICATE_EXPIRING = "CertificateExpiring"  # a mounted certificate expires within the warning window
CERTIFICATE_EXPIRED = "CertificateExpired"
CERTIFICATE_UNREADABLE = "CertificateUnreadable"  # a TLS Secret's ca.crt or tls.crt is not a PEM certificate
CERTIFICATES_VALID = "CertificatesValid"


@dataclass(frozen=True)
class Problem:
    """Something that keeps the spec from being applied; `reason` is the Degraded reason."""

    reason: str
    message: str


@dataclass(frozen=True)
class Rollout:
    """The facts of a Deployment's status that the conditions depend on."""

    exists: bool
    desired: int
    replicas: int = 0
    updated: int = 0
    ready: int = 0
    observed: bool = False  # the Deployment controller has seen the latest Deployment spec
    stuck_message: str | None = None
    completed_before: bool = False  # the controller reported the rollout complete at least once

    @property
    def complete(self) -> bool:
        return (
            self.exists
            and self.observed
            and self.updated >= self.desired
            and self.replicas <= self.desired
            and self.ready >= self.desired
        )


def rollout_of(deployment: Mapping[str, Any] | None, desired: int) -> Rollout:
    if not deployment:
        return Rollout(exists=False, desired=desired)
    meta = deployment.get("metadata") or {}
    status = deployment.get("status") or {}
    generation = meta.get("generation")
    observed_generation = status.get("observedGeneration")
    observed = (
        generation is not None and observed_generation is not None and observed_generation >= generation
    )
    stuck = None
    completed = False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing":
            if cond.get("reason") == "ProgressDeadlineExceeded":
                stuck = str(cond.get("message") or "progress deadline exceeded")
            completed = cond.get("reason") == "NewReplicaSetAvailable"
    return Rollout(
        exists=True,
        desired=desired,
        replicas=int(status.get("replicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        observed=observed,
        stuck_message=stuck,
        completed_before=completed,
    )


def _cond(kind: str, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": kind, "status": "True" if ok else "False", "reason": reason, "message": message
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


# Problems that are a planned step, not a fault: Progressing (and kstatus Reconciling), never Degraded.
WAITING = frozenset({POOL_HANDOVER})


def conditions_for(
    problems: Sequence[Problem], rollout: Rollout, generation: int | None
) -> list[dict[str, Any]]:
    """Ready, Progressing and Degraded, without transition times (see `merge_conditions`)."""
    pods = f"{rollout.ready}/{rollout.desired} pods ready"
    if problems and all(p.reason in WAITING for p in problems):
        reason, message = problems[0].reason, "; ".join(p.message for p in problems)
        return [
            _cond(READY, False, reason, message, generation),
            _cond(PROGRESSING, True, reason, message, generation),
            _cond(DEGRADED, False, HEALTHY, "no problems found", generation),
        ]
    if problems:
        reason = problems[0].reason
        message = "; ".join(p.message for p in problems)
        running = f" ({rollout.ready} pods of the previous configuration ready)" if rollout.ready else ""
        return [
            _cond(READY, False, reason, message + running, generation),
            _cond(PROGRESSING, False, BLOCKED, f"not applied until fixed: {message}", generation),
            _cond(DEGRADED, True, reason, message, generation),
        ]
    if rollout.stuck_message:
        degraded = _cond(DEGRADED, True, ROLLOUT_STUCK, rollout.stuck_message, generation)
    elif rollout.exists and rollout.observed and rollout.completed_before and rollout.ready < rollout.desired:
        degraded = _cond(DEGRADED, True, PODS_UNAVAILABLE, pods, generation)
    else:
        degraded = _cond(DEGRADED, False, HEALTHY, "no problems found", generation)

    if not rollout.exists:
        progressing = _cond(PROGRESSING, True, CREATING, "creating the worker Deployment", generation)
    elif rollout.stuck_message:
        progressing = _cond(PROGRESSING, False, ROLLOUT_STUCK, rollout.stuck_message, generation)
    elif rollout.complete:
        progressing = _cond(PROGRESSING, False, ROLLOUT_COMPLETE, pods, generation)
    else:
        updated = f"{rollout.updated}/{rollout.desired} pods updated, {pods}"
        progressing = _cond(PROGRESSING, True, ROLLING_OUT, updated, generation)

    if rollout.desired == 0:
        ready = _cond(READY, True, SCALED_TO_ZERO, "replicas is 0, as asked", generation)
    elif not rollout.exists:
        ready = _cond(READY, False, CREATING, "the worker Deployment does not exist yet", generation)
    elif rollout.ready >= 1:
        ready = _cond(READY, True, REPLICATING, pods, generation)
    else:
        ready = _cond(READY, False, PODS_NOT_READY, pods, generation)
    return [ready, progressing, degraded]


# Problems that stay until a person changes the spec, a Secret, the policy or the cluster: Stalled.
# The writer adds the policy's and the engine's (layers above this one).
PERMANENT = frozenset({SECRET_MISSING, SECRET_KEY_MISSING, CONNECTION_MISSING, INVALID_SPEC, NAME_CONFLICT,
                       CRD_MISSING, ROLLOUT_STUCK, POOL_MISMATCH})


def kstatus_conditions(main: Sequence[Mapping[str, Any]], permanent: frozenset[str],
                       generation: int | None, more: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Reconciling and Stalled, read off Progressing and Degraded (and a True `CopyLoop` among
    `more`: a worker refuses to copy until the spec changes), so that kstatus (Flux's health checks
    and `--wait`) fails at once on a permanent problem instead of waiting for Ready."""
    by_type = {c["type"]: c for c in main}
    loop = next((c for c in more if c.get("type") == COPY_LOOP and c.get("status") == "True"), None)
    if loop is not None and by_type.get(DEGRADED, {}).get("status") != "True":
        by_type[DEGRADED] = loop
    progressing, degraded = by_type.get(PROGRESSING) or {}, by_type.get(DEGRADED) or {}
    working = progressing.get("status") == "True"
    reconciling = _cond(RECONCILING, working, str(progressing.get("reason") or CREATING),
                        str(progressing.get("message") or ""), generation)
    if degraded.get("status") == "True" and degraded.get("reason") in permanent and not working:
        stalled = _cond(STALLED, True, str(degraded["reason"]), str(degraded.get("message") or ""), generation)
    elif degraded.get("status") == "True":
        stalled = _cond(STALLED, False, RETRYING, f"{degraded.get('reason')}: the operator retries by itself",
                        generation)
    else:
        stalled = _cond(STALLED, False, HEALTHY, "no problems found", generation)
    return [reconciling, stalled]


def paused_conditions(old: Sequence[Mapping[str, Any]] | None, annotation: str,
                      now: dt.datetime) -> list[dict[str, Any]]:
    """The conditions while paused: the last ones seen, kept; Reconciling False; Paused True."""
    kept = [dict(c) for c in old or [] if c.get("type") not in (RECONCILING, PAUSED)]
    generation = next((c.get("observedGeneration") for c in kept if c.get("type") == READY), None)
    why = f"the annotation {annotation} is \"true\": nothing is reconciled until it is removed"
    return merge_conditions(old, [*kept, _cond(RECONCILING, False, PAUSED_BY_ANNOTATION, why, generation),
                                  _cond(PAUSED, True, PAUSED_BY_ANNOTATION, why, generation)], now)


@dataclass(frozen=True)
class Native:
    """What the native engine observed: its entry on the target stream and NATS's error for it."""

    configured: bool = False
    stream: str | None = None
    source: str | None = None
    error: str | None = None
    stopping: bool = False  # the replicator's pods are still going away
    unready: tuple[str, str] | None = None  # (reason, message): runs without error, yet not Ready (engine/health.py)
    degrading: bool = False  # `unready` is a problem (the source is out of reach), not just a lag
    mirror: bool = False  # the target stream is a mirror of the source (engine/mirror.py)
    recreated: str | None = None  # the last repair of a recreated source stream (status.native.lastRecreation)


def conditions_for_native(
    problems: Sequence[Problem], native: Native, generation: int | None
) -> list[dict[str, Any]]:
    """Ready, Progressing and Degraded for the native engine, read like the pods' ones."""
    if problems:
        return conditions_for(problems, Rollout(exists=False, desired=0), generation)
    healthy = _cond(DEGRADED, False, HEALTHY, "no problems found", generation)
    if native.stopping:
        waiting = "waiting for the replicator's pods to be gone before NATS takes over"
        return [
            _cond(READY, False, STOPPING_REPLICATOR, waiting, generation),
            _cond(PROGRESSING, True, STOPPING_REPLICATOR, waiting, generation),
            healthy,
        ]
    if not native.configured:
        creating = f"adding the source entry to stream {native.stream}"
        return [
            _cond(READY, False, CREATING, creating, generation),
            _cond(PROGRESSING, True, CREATING, creating, generation),
            healthy,
        ]
    entry = f"stream {native.stream} {'mirrors' if native.mirror else 'sources'} {native.source}"
    progressing = _cond(PROGRESSING, False, SOURCE_CONFIGURED, entry, generation)
    main = _native_main(native, entry, progressing, healthy, generation)
    if native.recreated:  # stays while status.native says so: when, and what was done
        main.append(_cond(SOURCE_RECREATED, True, REPAIRED, native.recreated, generation))
    return main


def _native_main(native: Native, entry: str, progressing: dict[str, Any], healthy: dict[str, Any],
                 generation: int | None) -> list[dict[str, Any]]:
    if native.error:
        return [
            _cond(READY, False, SOURCE_ERROR, native.error, generation),
            progressing,
            _cond(DEGRADED, True, SOURCE_ERROR, native.error, generation),
        ]
    if native.unready:
        reason, message = native.unready
        degraded = _cond(DEGRADED, True, reason, message, generation) if native.degrading else healthy
        return [_cond(READY, False, reason, message, generation), progressing, degraded]
    return [_cond(READY, True, SOURCING, f"NATS copies: {entry}", generation), progressing, healthy]


@dataclass(frozen=True)
class MountedCertificate:
    """A certificate in a TLS Secret the workers mount; `not_after` None: it cannot be parsed."""

    where: str  # 'secret "x" key "tls.crt"'
    subject: str = ""
    not_after: dt.datetime | None = None


def _stamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 86400:
        return f"{seconds // 86400}d"
    return f"{seconds // 3600}h" if seconds >= 3600 else f"{max(seconds, 0) // 60}m"


def certificate_condition(
    certificates: Sequence[MountedCertificate], now: dt.datetime, window: dt.timedelta, generation: int | None
) -> dict[str, Any] | None:
    """`CertificatesExpiring`: True (a warning) when a mounted certificate expires within `window`,
    has expired or cannot be read; None when no TLS Secret is mounted."""
    if not certificates:
        return None
    unreadable = [c.where for c in certificates if c.not_after is None]
    if unreadable:
        return _cond(CERTIFICATES_EXPIRING, True, CERTIFICATE_UNREADABLE,
                     f"{', '.join(unreadable)}: not a PEM certificate", generation)
    first = min(certificates, key=lambda c: c.not_after or now)
    assert first.not_after is not None
    left = first.not_after - now
    what = f"{first.where} ({first.subject})"
    if left.total_seconds() <= 0:
        return _cond(CERTIFICATES_EXPIRING, True, CERTIFICATE_EXPIRED,
                     f"{what} expired at {_stamp(first.not_after)}: renew it", generation)
    if left <= window:
        return _cond(CERTIFICATES_EXPIRING, True, CERTIFICATE_EXPIRING,
                     f"{what} expires at {_stamp(first.not_after)}, in {_span(left)} (warning window "
                     f"{_span(window)}): renew it, running pods pick it up without a restart", generation)
    return _cond(CERTIFICATES_EXPIRING, False, CERTIFICATES_VALID,
                 f"every mounted certificate is valid beyond the {_span(window)} warning window; the first to "
                 f"expire is {what} at {_stamp(first.not_after)}", generation)


def merge_conditions(
    old: Iterable[Mapping[str, Any]] | None, new: Iterable[Mapping[str, Any]], now: dt.datetime
) -> list[dict[str, Any]]:
    """Keep `lastTransitionTime` while a condition's status stays; stamp `now` when it flips."""
    previous = {c.get("type"): c for c in (old or [])}
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        result = dict(cond)
        if before and before.get("status") == cond["status"] and before.get("lastTransitionTime"):
            result["lastTransitionTime"] = before["lastTransitionTime"]
        else:
            result["lastTransitionTime"] = stamp
        merged.append(result)
    return merged


def build_status(
    *,
    name: str,
    generation: int | None,
    problems: Sequence[Problem],
    deployment: Mapping[str, Any] | None,
    desired_replicas: int,
    old_status: Mapping[str, Any] | None,
    now: dt.datetime,
    native: Native | None = None,
    extra_conditions: Sequence[Mapping[str, Any]] = (),
    certificates: Mapping[str, Any] | None = None,
    permanent: frozenset[str] = PERMANENT,
) -> dict[str, Any]:
    """The status fields this operator owns, apart from lag/lastActive/fleet (see `nats_status`).
    `native`: the resource runs on the native engine (no pods); `extra_conditions`: more
    conditions (the engine choice), merged the same way; `certificates`: the
    `certificate_condition`, if any; `permanent`: the Degraded reasons that make it Stalled."""
    rollout = rollout_of(deployment, desired_replicas)
    main = conditions_for_native(problems, native, generation) if native else conditions_for(
        problems, rollout, generation)
    more = [*kstatus_conditions(main, permanent | {LOOP_REFUSED}, generation, extra_conditions), *extra_conditions,
            *([certificates] if certificates is not None else [])]
    conditions = merge_conditions((old_status or {}).get("conditions"), [*main, *more], now)
    status: dict[str, Any] = {
        "conditions": conditions,
        "replicas": rollout.replicas,
        "readyReplicas": rollout.ready,
        "selector": naming.selector_string(name),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def status_patch(old_status: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """Only the top-level status fields that change (empty: nothing to write)."""
    old = old_status or {}
    return {k: v for k, v in new.items() if old.get(k) != v}


def condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


COPY_LOOP = "CopyLoop"  # only once a worker noted a loop on its consumer (replicator/copier/loops.py)
LOOP_REFUSED = "LoopRefused"  # True: a worker refused to copy a copy back (exit status 2, restarting)
LOOPS_SKIPPED = "LoopsSkipped"  # False: active-active, copies that would loop are skipped and counted
NO_LOOP = "NoLoop"


def loop_condition(note: str | None, generation: int | None) -> dict[str, Any] | None:
    """`CopyLoop` from the workers' consumer notes: True while one refuses a loop, False while
    active-active skips them (or after a note went away); None when no worker ever noted one."""
    if note is None:
        return None
    if "refused" in note:
        return _cond(COPY_LOOP, True, LOOP_REFUSED, f"{note}: the copies would come back to the source; set "
                     "target.subjectPrefix, use another account, or engine: native (activeActive if two sites "
                     "replicate into each other on purpose)", generation)
    if note:
        return _cond(COPY_LOOP, False, LOOPS_SKIPPED, note, generation)
    return _cond(COPY_LOOP, False, NO_LOOP, "no worker notes a copy loop", generation)
