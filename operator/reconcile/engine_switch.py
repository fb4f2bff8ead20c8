"""Running a resource on the native engine, and switching engines without losing or repeating a
message.

replicator -> native: the worker Deployment is deleted in the foreground (the API server removes it
only once its pods are gone), then the last source sequence the replicator landed is read from its
provenance on the target, and the source entry starts right after it. native -> replicator: the
entry is removed first (NATS stops copying at once), the last sequence it delivered is read from
NATS's own `Nats-Stream-Source` header on the target, and the worker config gets `resume_after`.
Each step's result is written to the resource's status before the next step, so a restart in the
middle continues where it stopped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replication_operator.checks.secrets import Secrets
from replication_operator.engine import choice as engine
from replication_operator.engine import entry as native
from replication_operator.engine import health, mirror
from replication_operator.engine.choice import NATIVE, REPLICATOR, Choice
from replication_operator.engine.entry import Start
from replication_operator.engine.target import NativeError, TargetSession
from replication_operator.kube import APIError, KubeApi, error_text
from replication_operator.metrics import NativeSample
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import ReplicationSpec
from replication_operator.nats.connection import NatsStatusError
from replication_operator.nats.probes import SourceState
from replication_operator.reconcile import native_watch
from replication_operator.reconcile.events import Events
from replication_operator.reconcile.memory import Memory
from replication_operator.reconcile.status_writer import StatusWriter

from replicator.copier.provenance import PROVENANCE, parse_provenance
from replicator.transport.subjects import rewrite_subject


def _replicator_children(name: str) -> list[tuple[naming.Kind, str]]:
    """The replicator's children other than its Deployment: deleted once the pods are gone."""
    return [
        (naming.CONFIGMAP, naming.configmap_name(name)),
        (naming.SERVICE, naming.service_name(name)),
        (naming.PDB, naming.pdb_name(name)),
        (naming.SERVICE_MONITOR, naming.service_monitor_name(name)),
        (naming.SCHEDULED_SPARK_APPLICATION, naming.fleet_health_name(name)),
    ]


class WouldRepeat(NativeError):
    """Starting the entry now would copy again what the replicator copied (see engine.would_repeat)."""


@dataclass
class NativeOutcome:
    problems: list[st.Problem] = field(default_factory=list)
    view: st.Native | None = None
    retry: bool = False


class EngineSwitch:
    """The native engine's side of a reconcile pass: which engine runs, the native engine's entry,
    and the handovers; the Reconciler owns the rest. Its state is `memory.engine`."""

    def __init__(self, api: KubeApi, secrets: Secrets, events: Events, status: StatusWriter,
                 clock: Callable[[], dt.datetime], nats_timeout: float) -> None:
        self.api = api
        self.secrets = secrets
        self.events = events
        self.status = status
        self.clock = clock
        self.nats_timeout = nats_timeout

    async def _session(self, spec: ReplicationSpec) -> TargetSession:
        auth = await self.secrets.auth(spec, spec.target)
        return TargetSession(spec.target.url, auth, self.nats_timeout)

    # ---- which engine ----
    async def choose(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory) -> Choice:
        """Made once per spec generation (remembered in the Engine condition across restarts);
        a choice that cannot run (`problem`) is tried again on every pass."""
        generation = (body.get("metadata") or {}).get("generation")
        state = memory.engine
        if state.choice is not None and state.choice_generation == generation and not state.choice.problem:
            return state.choice
        recorded = st.condition(memory.current_status(body), engine.CONDITION)
        if (state.choice is None and recorded and recorded.get("status") == "True" and generation is not None
                and recorded.get("observedGeneration") == generation):
            message = str(recorded.get("message") or "").split(": ", 1)[-1]
            choice = Choice(engine.engine_of(str(recorded.get("reason")), spec), str(recorded.get("reason")), message)
        else:
            choice = engine.before_probe(spec) or await self._probe(
                spec, memory.current_status(body))
            previous = state.choice  # a problem is posted with the others (Degraded, a Warning)
            if not choice.problem and (previous is None or (previous.engine, previous.reason, previous.message) != (
                    choice.engine, choice.reason, choice.message)):
                self.events.post(body, "Normal", "EngineChosen", f"{choice.engine}: {choice.message}")
        state.choice, state.choice_generation = choice, generation
        return choice

    async def _probe(self, spec: ReplicationSpec, status: Mapping[str, Any]) -> Choice:
        path = engine.route(spec)
        assert path is not None
        repeat = None
        try:
            async with await self._session(spec) as target:
                stream, _ = await target.source_stream(path, spec.source.stream, spec.topic)
                repeat = await self._repeat(spec, status, target, spec.target.stream or stream, stream)
        except (NativeError, NatsStatusError) as err:
            return engine.after_probe(spec, path, None, str(err))
        return engine.after_probe(spec, path, stream, None, repeat)

    async def _repeat(self, spec: ReplicationSpec, status: Mapping[str, Any], target: TargetSession,
                      stream: str, source_stream: str) -> str | None:
        """Back from the replicator to native after an earlier native period: NATS would resume its
        old entry (where it stopped, `status.resumeAfter`) rather than after the replicator's copies."""
        remembered = status.get("resumeAfter")
        if status.get("engine") != REPLICATOR or not remembered:
            return None
        landed = await self._landed(spec, target, stream, source_stream)
        return engine.would_repeat(int(remembered), landed, stream) if landed > int(remembered) else None

    async def _landed(self, spec: ReplicationSpec, target: TargetSession, stream: str, source_stream: str) -> int:
        if await target.stream_info(stream) is None:
            return 0
        path = engine.route(spec)
        assert path is not None
        writer = await target.writer(path, source_stream, spec.replicator_name)
        subject = rewrite_subject(spec.topic, spec.target.subject_prefix, spec.target.subject_remove)
        return await target.replicator_landed(stream, subject, writer)

    # ---- native in charge ----
    async def run(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory) -> NativeOutcome:
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        deployment = await self.api.get_quietly(naming.DEPLOYMENT, namespace, naming.deployment_name(name))
        if deployment is not None and naming.controlled_by(deployment, uid):
            return await self._stop_pods(body, deployment, memory)
        memory.engine.awaiting_pods = False
        outcome = NativeOutcome()
        try:
            async with await self._session(spec) as target:
                outcome = await self._configure(body, spec, memory, target)
        except WouldRepeat as err:  # decide again: auto goes back to the replicator
            memory.engine.choice = None
            outcome.problems.append(st.Problem(engine.NATIVE_WOULD_REPEAT, str(err)))
            outcome.retry = True
            return outcome
        except (NativeError, NatsStatusError) as err:
            outcome.problems.append(st.Problem(engine.SOURCE_ENTRY_FAILED, f"native engine: {err}"))
        except APIError as err:  # a step's status could not be recorded: the next pass repeats it
            outcome.problems.append(st.Problem(st.APPLY_FAILED, f"status: {error_text(err)}"))
            outcome.retry = True
        if not memory.engine.children_gone and await self._delete_children(body, outcome):
            memory.engine.children_gone = True
        return outcome

    async def _stop_pods(self, body: Mapping[str, Any], deployment: Mapping[str, Any],
                         memory: Memory) -> NativeOutcome:
        meta = body["metadata"]
        memory.engine.awaiting_pods = True
        memory.engine.children_gone = False
        if not (deployment.get("metadata") or {}).get("deletionTimestamp"):
            try:
                await self.api.delete(naming.DEPLOYMENT, meta["namespace"], deployment["metadata"]["name"],
                                      uid=deployment["metadata"].get("uid"), foreground=True)
            except APIError as err:
                return NativeOutcome([st.Problem(st.APPLY_FAILED, f"deleting Deployment: {error_text(err)}")],
                                     retry=True)
            self.events.post(body, "Normal", st.STOPPING_REPLICATOR,
                             f"deleting Deployment {deployment['metadata']['name']}: NATS takes over once its pods "
                             "are gone")
        return NativeOutcome(view=st.Native(stopping=True))

    async def _configure(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory,
                         target: TargetSession) -> NativeOutcome:
        path = engine.route(spec)
        assert path is not None
        status = memory.current_status(body)
        recorded = dict(status.get("native") or {})
        try:
            source_stream, source = await target.source_stream(path, spec.source.stream, spec.topic)
            source_error = None
        except NativeError as err:  # the entry can still be kept as it is
            source_stream, source, source_error = spec.source.stream or recorded.get("sourceStream"), None, str(err)
        if not source_stream:
            raise NativeError(source_error or "no source stream")
        stream = spec.target.stream or source_stream
        start = Start.from_status(recorded.get("start")) if status.get("engine") == NATIVE else None
        if start is None:
            start = await self._first_start(spec, status, target, stream, source, source_stream)
            recorded = {**recorded, "stream": stream, "start": start.status()}
            await self.status.persist(body, memory, {"engine": NATIVE, "native": recorded, "resumeAfter": None})
        desired = native.build_entry(spec, path, source_stream, start)
        if mirror.whole(recorded):
            desired = mirror.unfiltered(desired)
        if native.moved(recorded, desired, stream):  # the spec moved it: go on where the old one stopped
            last = await self._detach(target, recorded, spec)
            start = Start(sequence=last + 1) if last else start
            recorded = {"stream": stream, "start": start.status()}
            if mirror.is_mirror(status.get("native") or {}):  # NATS cannot change what a mirror copies
                recorded.update(form=mirror.SOURCE, formReason=mirror.PROMOTED + "the spec changed what it copies")
            await self.status.persist(body, memory, {"native": recorded})
            desired = native.build_entry(spec, path, source_stream, start)
            self.events.post(body, "Normal", "SourceMoved", "the spec moved the source entry: removed the old one"
                             + (f", the new one starts after source sequence {last}" if last else ""))
        owned = [i for i in [native.identity_from_status(recorded)] if i]
        info = await target.stream_info(stream)
        label = f"stream {stream}"
        if info is not None and mirror.is_mirror(recorded) and mirror.live_mirror(info["config"]) is None:
            # Promoted outside the operator, or by a second source: a source entry goes on after what
            # the mirror copied (its last copy on our subjects; another entry may have written since).
            ours = rewrite_subject(spec.topic, spec.target.subject_prefix, spec.target.subject_remove)
            last = await native_watch.last_sequence(target, stream, ours) or int(
                (info.get("state") or {}).get("last_seq") or 0)
            start = Start(sequence=last + 1)
            desired = native.build_entry(spec, path, source_stream, start)
            recorded = {"stream": stream, "start": start.status(), "form": mirror.SOURCE,
                        "formReason": mirror.PROMOTED + "outside the operator"}
            await self.status.persist(body, memory, {"native": recorded})
            self.events.post(body, "Normal", "Promoted", f"{label} is no longer a mirror: a source entry goes on "
                             f"after source sequence {last}")
        if info is None:
            if not spec.target.create:
                return NativeOutcome([st.Problem(engine.TARGET_STREAM_MISSING,
                                                 f"target stream {stream} does not exist and spec.target.create "
                                                 "is false")])
            if source is None:
                raise NativeError(f"cannot create target stream {stream}: {source_error}")
            form, why = mirror.form_for_new_stream(spec)
            build = mirror.mirror_config if form == mirror.MIRROR else native.target_config
            if form == mirror.MIRROR and health.covers(spec.topic, source["config"].get("subjects") or []):
                desired = mirror.unfiltered(desired)
            info = await target.create_stream(build(source["config"], spec, stream, desired, source_stream))
            recorded = {**recorded, "form": form, "formReason": why}
            what = "mirroring" if form == mirror.MIRROR else "sourcing"
            self.events.post(body, "Normal", "Created", f"created {label} {what} {source_stream} through {path.via}")
        elif mirror.is_mirror(recorded):
            pass  # NATS cannot change a mirror: a spec that changes what it copies promoted it above
        else:
            if not recorded.get("form"):
                recorded = {**recorded, "form": mirror.SOURCE, "formReason": mirror.existing_reason(spec)}
            held = mirror.live_mirror(info["config"])
            if held is not None:  # a mirror takes no source entry
                if not mirror.made_by_operator(info["config"]):
                    return NativeOutcome([st.Problem(engine.SOURCE_ENTRY_FAILED, f"target stream {stream} is a "
                                                     f"mirror of {held.get('name')} made outside the operator: "
                                                     "NATS adds no source entry to a mirror")])
                info = await target.update_stream(mirror.promoted(info["config"], None))
                self.events.post(body, "Normal", "Promoted", f"promoted {label}, the mirror of {held.get('name')} "
                                 "another StreamReplication created, to take this second source (it goes on as a "
                                 "source entry)")
            live = info["config"].get("sources")
            sources = native.with_entry(live, desired, owned)
            if sources is not None:
                before = [s for s in live or [] if native.identity(s) in {native.identity(desired), *owned}]
                info = await target.update_stream({**info["config"], "sources": sources})
                self.events.post(body, "Normal", *self._change(label, source_stream, before, desired, recorded))
        recorded = {**recorded, "stream": stream, **native.identity_status(desired),
                    "destinations": list(native.destinations(desired))}
        if recorded != status.get("native"):
            await self.status.persist(body, memory, {"native": recorded})
        looked = await native_watch.measure(spec, self.secrets, target, recorded, info, desired, self.nats_timeout)
        if looked.state is not None:
            why = health.recreated(recorded.get("sourceCreated"), looked.state.created, looked.state.last_seq,
                                   looked.seen.current)
            if not why and source is not None:  # the target reaches the source: not a cut link
                why = health.silent(memory.engine.progress, looked.seen, self.clock(), spec.native)
            if why:
                recorded, info, desired = await self._restart(body, spec, memory, target, recorded, info,
                                                              looked.state, why)
                looked = await native_watch.measure(spec, self.secrets, target, recorded, info, desired,
                                                    self.nats_timeout)
            elif looked.state.created and recorded.get("sourceCreated") != looked.state.created:
                recorded = {**recorded, "sourceCreated": looked.state.created}
                await self.status.persist(body, memory, {"native": recorded})
        return NativeOutcome(view=self._observe(memory, spec, looked.seen, stream, source_stream, recorded))

    async def _restart(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory, target: TargetSession,
                       recorded: dict[str, Any], info: Mapping[str, Any], state: SourceState,
                       why: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The source stream was created again: NATS would wait for sequences the new stream reaches
        only later and skip everything before (or, for a mirror, collide with the sequences it has).
        The entry starts again at the new stream's first sequence: removed, then added back, which
        NATS takes as a new entry since the position it recorded is for the old stream; a mirror is
        promoted and a source entry goes on instead. Returns (recorded, target info, entry)."""
        path = engine.route(spec)
        assert path is not None
        stream, source_stream = str(recorded["stream"]), str(recorded["sourceStream"])
        owned = [i for i in [native.identity_from_status(recorded)] if i]
        was_mirror = mirror.is_mirror(recorded)
        if was_mirror:
            await self._promote(target, info, spec)
        else:
            await self._detach_entry(target, info, owned)
        start = Start(sequence=max(1, state.first_seq))
        desired = native.build_entry(spec, path, source_stream, start)
        current = await target.stream_info(stream)
        if current is None:
            raise NativeError(f"target stream {stream} disappeared while its entry was reset")
        sources = native.with_entry(current["config"].get("sources"), desired, owned) or current["config"].get(
            "sources")
        current = await target.update_stream({**current["config"], "sources": sources})
        lost = f"; the new stream starts at sequence {state.first_seq}: {state.first_seq - 1} of its messages " \
               "were gone before the repair" if state.first_seq > 1 else ""
        message = (f"source stream {source_stream} taken for a new stream: {why}; the "
                   + ("mirror was promoted and a source entry" if was_mirror else "entry")
                   + f" starts again at its sequence {start.sequence}{lost}")
        count = int(recorded.get("recreations") or 0) + 1
        recorded = {**recorded, "start": start.status(), "sourceCreated": state.created, "recreations": count,
                    "lastRecreation": f"{self.clock().strftime('%Y-%m-%dT%H:%M:%SZ')}: {message}"}
        if was_mirror:
            recorded.update(form=mirror.SOURCE, formReason=mirror.PROMOTED + "the source stream was created again")
        await self.status.persist(body, memory, {"native": recorded})
        self.events.post(body, "Warning", st.SOURCE_RECREATED, message)
        return recorded, current, desired

    @staticmethod
    async def _detach_entry(target: TargetSession, info: Mapping[str, Any], owned: list[native.Identity]) -> None:
        sources = native.without_entry(info["config"].get("sources"), owned)
        if sources is not None:
            await target.update_stream({**info["config"], "sources": sources})

    def _observe(self, memory: Memory, spec: ReplicationSpec, seen: health.SourceHealth, stream: str | None,
                 source: str | None, recorded: Mapping[str, Any]) -> st.Native:
        """What the target stream says about our entry: status.lag/lastActive and the conditions' view."""
        state = memory.engine
        state.progress, seen = health.progress(state.progress, seen, self.clock())
        state.native_fields = health.status_fields(seen, state.progress)
        state.sample = NativeSample(spec.replicator_name, seen.lag, seen.current, seen.inactive,
                                    seen.error is not None, int(recorded.get("recreations") or 0))
        unready = None if seen.error else seen.unready(spec.native)
        return st.Native(configured=True, stream=stream, source=source, error=seen.error, unready=unready,
                         degrading=unready is not None and unready[0] == health.SOURCE_INACTIVE,
                         mirror=mirror.is_mirror(recorded), recreated=recorded.get("lastRecreation"))

    @staticmethod
    def _change(label: str, source: str, before: list[Mapping[str, Any]], desired: Mapping[str, Any],
                recorded: Mapping[str, Any]) -> tuple[str, str]:
        if not before:
            if recorded.get("sourceStream"):
                return "Restored", f"put back the source entry for {source} in {label} (it was removed)"
            return "SourceAdded", f"added a source entry for {source} to {label}"
        if native.identity(before[0]) == native.identity(desired) and native.identity_from_status(recorded) == (
                native.identity(desired)):
            return "Reverted", f"put back the source entry for {source} in {label} (changed outside the operator)"
        return "Updated", f"updated the source entry for {source} in {label}"

    async def _first_start(self, spec: ReplicationSpec, status: Mapping[str, Any], target: TargetSession,
                           stream: str, source: Mapping[str, Any] | None, source_stream: str) -> Start:
        """Right after what the replicator landed when it ran before; else `spec.start`."""
        if status.get("engine") == REPLICATOR:
            landed = await self._landed(spec, target, stream, source_stream)
            remembered = int(status.get("resumeAfter") or 0)
            if remembered and landed > remembered:  # the pods copied on after the engine was chosen
                raise WouldRepeat(engine.would_repeat(remembered, landed, stream))
            if landed:
                return Start(sequence=landed + 1)
        last = int(((source or {}).get("state") or {}).get("last_seq") or 0)
        if spec.start is not None and spec.start.at_end and source is None:
            raise NativeError("start.atEnd needs the source stream's last sequence, which the target cannot read")
        return native.spec_start(spec, self.clock(), last)

    async def _delete_children(self, body: Mapping[str, Any], outcome: NativeOutcome) -> bool:
        meta = body["metadata"]
        done = True
        for kind, child in _replicator_children(meta["name"]):
            live = await self.api.get_quietly(kind, meta["namespace"], child)
            if live is None or not naming.controlled_by(live, meta["uid"]):
                continue
            try:
                await self.api.delete(kind, meta["namespace"], child, uid=live["metadata"].get("uid"))
                self.events.post(body, "Normal", "Deleted", f"deleted {kind.kind} {child} (native engine)")
            except APIError as err:
                outcome.problems.append(st.Problem(st.APPLY_FAILED, f"deleting {kind.kind} {child}: {error_text(err)}"))
                done = False
        return done

    # ---- the replicator takes over ----
    async def leave(self, body: Mapping[str, Any], spec: ReplicationSpec,
                    memory: Memory) -> tuple[list[st.Problem], int | None]:
        """Remove our entry and find where NATS stopped: (problems, resume_after for the replicator)."""
        status = memory.current_status(body)
        recorded = status.get("native")
        if not recorded:
            return [], status.get("resumeAfter")
        stream = str(recorded.get("stream"))

        try:
            async with await self._session(spec) as target:
                last = await self._detach(target, recorded, spec)
                what = "promoted the mirror" if mirror.is_mirror(recorded) else "removed the source entry from"
            self.events.post(body, "Normal", "Promoted" if mirror.is_mirror(recorded) else "SourceRemoved",
                             f"{what} stream {stream}: the replicator takes over "
                             + (f"after source sequence {last}" if last else "where it left off"))
        except (NativeError, NatsStatusError) as err:
            return [st.Problem(engine.HANDOVER_FAILED, f"cannot hand over from the native engine: {err}")], None
        try:
            await self.status.persist(body, memory, {"engine": REPLICATOR, "native": None, "resumeAfter": last})
        except APIError as err:  # the entry is gone: the next pass finds the same position again
            return [st.Problem(st.APPLY_FAILED, f"status: {error_text(err)}")], None
        memory.engine.native_fields = {}
        memory.engine.sample = memory.engine.progress = None
        return [], last

    async def _detach(self, target: TargetSession, recorded: Mapping[str, Any], spec: ReplicationSpec) -> int | None:
        """Remove the entry status.native records from its stream; the last source sequence it
        delivered there (None: nothing, or the stream is gone)."""
        stream = str(recorded.get("stream"))
        info = await target.stream_info(stream)
        if info is None:
            return None
        if mirror.is_mirror(recorded):
            return await self._promote(target, info, spec)
        owned = native.identity_from_status(recorded)
        sources = native.without_entry(info["config"].get("sources"), [owned] if owned else [])
        if sources is not None:
            await target.update_stream({**info["config"], "sources": sources})

        def replicators_copy(headers: dict[str, str]) -> bool:
            """A copy the replicator made before this entry: the entry delivered nothing later."""
            prov = parse_provenance(headers.get(PROVENANCE))
            return (prov is not None and prov.stream == recorded.get("sourceStream")
                    and prov.name == spec.replicator_name)

        return await target.last_delivered(stream, recorded, replicators_copy)

    @staticmethod
    async def _promote(target: TargetSession, info: Mapping[str, Any], spec: ReplicationSpec) -> int | None:
        """The mirror becomes a plain stream (NATS 2.12+): it stops copying at once, keeps its messages
        and their sequences, and takes the replicator's subjects. A mirror's last sequence is the last
        source sequence it copied (None: it copied nothing)."""
        if mirror.live_mirror(info["config"]) is not None:
            info = await target.update_stream(mirror.promoted(info["config"], spec))
        return int((info.get("state") or {}).get("last_seq") or 0) or None

    async def remove(self, body: Mapping[str, Any], spec: ReplicationSpec) -> str | None:
        """The resource is being deleted: remove our entry (the stream and its messages stay).
        Returns what was done, for the log; raises NativeError/NatsStatusError when it cannot."""
        recorded = (body.get("status") or {}).get("native")
        if not recorded:
            return None
        owned = native.identity_from_status(recorded)
        stream = str(recorded.get("stream"))
        async with await self._session(spec) as target:
            info = await target.stream_info(stream)
            if info is None or owned is None:
                return None
            if mirror.is_mirror(recorded):
                last = await self._promote(target, info, spec)
                return f"promoted stream {stream}, a mirror of {recorded.get('sourceStream')} up to sequence {last}"
            sources = native.without_entry(info["config"].get("sources"), [owned])
            if sources is None:
                return None
            await target.update_stream({**info["config"], "sources": sources})
        return f"removed the source entry for {recorded.get('sourceStream')} from stream {stream}"

    async def refresh(self, body: Mapping[str, Any], spec: ReplicationSpec, memory: Memory) -> bool:
        """The status tick: lag, last activity and NATS's error from the target stream's info.
        False when the entry is missing or changed (drift: the caller reconciles)."""
        recorded = memory.current_status(body).get("native") or {}
        owned = native.identity_from_status(recorded)
        path = engine.route(spec)
        if owned is None or path is None:
            return True
        async with await self._session(spec) as target:
            info = await target.stream_info(str(recorded.get("stream")))
            if info is None:
                return False
            if mirror.is_mirror(recorded):
                live = mirror.live_mirror(info["config"])
            else:
                live = native.find_entry(info["config"].get("sources"), owned)
            start = Start.from_status(recorded.get("start")) or Start()
            desired = native.build_entry(spec, path, owned[0], start) if native.subject_mapping(spec) else None
            if desired is not None and mirror.whole(recorded):
                desired = mirror.unfiltered(desired)
            if (live is None or desired is None or native.identity(desired) != owned
                    or native.identity(live) != owned or not native.same_entry(live, desired)):
                return False
            looked = await native_watch.measure(spec, self.secrets, target, recorded, info, live, self.nats_timeout)
        if looked.state is not None and health.recreated(recorded.get("sourceCreated"), looked.state.created,
                                                         looked.state.last_seq, looked.seen.current):
            return False  # a new source stream: the pass resets the entry
        view = self._observe(memory, spec, looked.seen, str(recorded.get("stream")), owned[0], recorded)
        if memory.engine.native_view is not None:
            memory.engine.native_view = view
        return True
