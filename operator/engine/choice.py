"""Which engine copies a resource's messages: NATS itself (a source entry on the target stream,
`native`) or the replicator's pods (`replicator`). Pure: the spec, and the result of a probe from
the target to the source, in; a choice and its reason out.

`auto` picks native when the spec asks for nothing only the replicator can do and the target
reaches the source stream's info through the given JetStream domain or API prefix; the choice is
made once per spec generation (a flaky link does not flip engines back and forth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replication_operator.engine.entry import Route, subject_mapping
from replication_operator.model.spec import ReplicationSpec

NATIVE = "native"
REPLICATOR = "replicator"

CONDITION = "Engine"  # status condition: which engine was chosen, and why (reason below)
# Reasons for a choice.
REQUESTED = "Requested"  # spec.engine named the engine
NEEDS_REPLICATOR = "NeedsReplicator"  # auto: the spec uses something native cannot do
NO_ROUTE = "NoSourceRoute"  # auto: neither source.domain nor source.apiPrefix
SOURCE_UNREACHABLE = "SourceUnreachable"  # auto: the probe from the target failed
SOURCE_REACHABLE = "SourceReachable"  # auto: the probe from the target succeeded
# Degraded reasons when `native` is asked for but cannot run (the current engine keeps running).
NATIVE_UNSUPPORTED = "NativeUnsupported"
NATIVE_UNAVAILABLE = "NativeUnavailable"
NATIVE_WOULD_REPEAT = "NativeWouldRepeat"  # NATS would resume an earlier entry and copy again
# Degraded reasons while the native engine runs or hands over.
SOURCE_ENTRY_FAILED = "SourceEntryFailed"  # the target's stream could not be read or changed
TARGET_STREAM_MISSING = "TargetStreamMissing"  # no target stream and spec.target.create is false
HANDOVER_FAILED = "HandoverFailed"  # native -> replicator: where NATS stopped could not be found


@dataclass(frozen=True)
class Choice:
    """`problem`: the requested engine cannot run; nothing changes and the resource is Degraded."""

    engine: str
    reason: str
    message: str
    problem: bool = False


def route(spec: ReplicationSpec) -> Route | None:
    source = spec.source
    if source.domain:
        return Route(api=f"$JS.{source.domain}.API", deliver=None, via=f'JetStream domain "{source.domain}"')
    if source.api_prefix:
        return Route(api=source.api_prefix, deliver=source.deliver_prefix, via=f'API prefix "{source.api_prefix}"')
    return None


def replicator_only(spec: ReplicationSpec) -> list[str]:
    """What the spec asks for that a NATS stream source cannot do (field: why)."""
    found = []
    if spec.sampling:
        found.append("spec.sampling (a stream source copies every message)")
    if spec.advisory:
        found.append("spec.advisory (advisories come from the replicator's sampling)")
    if spec.fleet_health:
        found.append("spec.fleetHealth (it aggregates the replicator's advisories)")
    if spec.max_age:
        found.append("spec.maxAge (a stream source cannot skip old messages)")
    if spec.dead_letter:
        found.append("spec.deadLetter (a stream source has no dead-letter subject)")
    if spec.heartbeats:
        found.append("spec.heartbeats (the replicator publishes them)")
    if spec.pool:
        found.append("spec.pool (a pool is the replicator's workers)")
    if spec.active_active:
        found.append("spec.activeActive (the replicator's loop guard skips the copies that would loop)")
    if subject_mapping(spec) is None:
        found.append("spec.target.subjectRemove with a wildcard topic (the replicator removes text anywhere "
                     "in a subject, a NATS subject transform maps whole tokens)")
    return found


def before_probe(spec: ReplicationSpec) -> Choice | None:
    """The choice when it needs no probe; None: probe the source from the target first."""
    if spec.engine == REPLICATOR:
        return Choice(REPLICATOR, REQUESTED, "spec.engine is replicator")
    obstacles = replicator_only(spec)
    path = route(spec)
    if spec.engine == NATIVE:
        if obstacles:
            return Choice(NATIVE, NATIVE_UNSUPPORTED,
                          f"spec.engine is native but the spec uses {'; '.join(obstacles)}", problem=True)
        if path is None:
            return Choice(NATIVE, NATIVE_UNSUPPORTED,
                          "spec.engine is native but neither spec.source.domain nor spec.source.apiPrefix "
                          "says how the target reaches the source's JetStream API", problem=True)
        return None
    if obstacles:
        return Choice(REPLICATOR, NEEDS_REPLICATOR, f"only the replicator can do {'; '.join(obstacles)}")
    if path is None:
        return Choice(REPLICATOR, NO_ROUTE, "neither spec.source.domain nor spec.source.apiPrefix says how the "
                                            "target reaches the source's JetStream API")
    return None


def would_repeat(remembered: int, landed: int, stream: str) -> str:
    """Why a source entry cannot come back once the replicator copied past where NATS stopped:
    NATS keeps its own position for an entry it had (and its copies carry it), so a new entry
    that NATS takes for the old one resumes there, whatever start the operator asks for."""
    return (f"NATS remembers that its source entry stopped at sequence {remembered} on stream {stream}; the "
            f"replicator has copied up to {landed} since, so an entry now would copy {landed - remembered} "
            "messages again (use a new target stream to run natively)")


def after_probe(spec: ReplicationSpec, path: Route, stream: str | None, error: str | None,
                repeat: str | None = None) -> Choice:
    """`error`: why the target could not read the source stream's info (None: it could);
    `repeat`: why a native entry would copy messages again (see `would_repeat`)."""
    if error is None and repeat is not None:
        if spec.engine == NATIVE:
            return Choice(NATIVE, NATIVE_WOULD_REPEAT, f"spec.engine is native but {repeat}", problem=True)
        return Choice(REPLICATOR, NATIVE_WOULD_REPEAT, repeat)
    if error is None:
        reason = REQUESTED if spec.engine == NATIVE else SOURCE_REACHABLE
        return Choice(NATIVE, reason, f"the target reaches stream {stream} through {path.via}")
    if spec.engine == NATIVE:
        return Choice(NATIVE, NATIVE_UNAVAILABLE,
                      f"spec.engine is native but the target cannot reach the source through {path.via}: {error}",
                      problem=True)
    return Choice(REPLICATOR, SOURCE_UNREACHABLE,
                  f"the target cannot reach the source through {path.via}: {error}")


def engine_of(reason: str, spec: ReplicationSpec) -> str:
    """The engine a recorded choice (its reason, at the same spec generation) stands for."""
    if reason == REQUESTED:
        return NATIVE if spec.engine == NATIVE else REPLICATOR
    return NATIVE if reason == SOURCE_REACHABLE else REPLICATOR


def condition(choice: Choice, generation: int | None) -> dict[str, Any]:
    """The Engine condition (without its transition time: status.merge_conditions adds it)."""
    cond: dict[str, Any] = {
        "type": CONDITION,
        "status": "False" if choice.problem else "True",
        "reason": choice.reason,
        "message": f"{choice.engine}: {choice.message}",
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond
