"""Writing a resource's status subresource: the only place that does, for the pass and the engine
switch alike. What was written is kept in the resource's Memory (later passes start from it), and
every status written also updates the operator's own metrics.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from replication_operator.checks import policy
from replication_operator.checks.certificates import certificate_event
from replication_operator.engine import choice as engine
from replication_operator.kube import APIError, APINotFoundError, KubeApi, error_text
from replication_operator.metrics import OperatorMetrics
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.reconcile.events import Events
from replication_operator.reconcile.memory import Memory, asked

log = logging.getLogger("replication_operator")

# Degraded reasons that only a person fixes (Stalled True): the model's, the policy's, the engine's.
PERMANENT = st.PERMANENT | policy.REASONS | {engine.NATIVE_UNSUPPORTED, engine.NATIVE_WOULD_REPEAT,
                                             engine.TARGET_STREAM_MISSING}


class StatusWriter:
    def __init__(self, api: KubeApi, metrics: OperatorMetrics, events: Events, clock: Callable[[], dt.datetime],
                 certificate_warning: float) -> None:
        self.api = api
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.certificate_window = dt.timedelta(seconds=certificate_warning)

    async def write(self, body: Mapping[str, Any], memory: Memory, deployment: Mapping[str, Any] | None,
                    replicas: int) -> None:
        """The conditions and replica counts from what the pass found (its problems, the engine, the
        Deployment, the certificates); a failed write is logged and tried again next time."""
        meta = body["metadata"]
        old = memory.current_status(body)
        running = memory.engine
        extra = [engine.condition(running.choice, running.choice_generation)] if running.choice else []
        loop = st.loop_condition(memory.copy_loop, memory.observed_generation)
        extra += [loop] if loop is not None else []
        now = self.clock()
        certificates = None  # the native engine mounts nothing
        if running.native_view is None:
            certificates = st.certificate_condition(memory.certificates, now, self.certificate_window,
                                                    memory.observed_generation)
        new = st.build_status(
            name=naming.pods_named_after(meta["name"], deployment),
            generation=memory.observed_generation,
            problems=memory.problems,
            deployment=deployment,
            desired_replicas=replicas,
            old_status=old,
            now=now,
            native=running.native_view,
            extra_conditions=extra,
            certificates=certificates,
            permanent=PERMANENT,
        )
        if running.native_view is not None:
            new.update(running.native_fields)
        memory.certificate_warning, event = certificate_event(certificates, memory.certificate_warning)
        if event is not None:
            self.events.post(body, *event)
        await self.update(body, memory, new)

    async def write_paused(self, body: Mapping[str, Any], memory: Memory) -> None:
        """Paused by annotation: the last conditions stay, Reconciling False and Paused True; the
        observedGeneration stays that of the last pass (a later spec is not applied)."""
        old = memory.current_status(body)
        conditions = st.paused_conditions(old.get("conditions"), naming.PAUSED_ANNOTATION, self.clock())
        if [(c["type"], c["status"]) for c in conditions] != [
                (c.get("type"), c.get("status")) for c in old.get("conditions") or []]:
            await self.update(body, memory, {"conditions": conditions})

    async def update(self, body: Mapping[str, Any], memory: Memory, fields: Mapping[str, Any]) -> None:
        """Write these top-level fields where they differ; a failed write is logged and tried again
        next time (the memory keeps the status as it was)."""
        old = memory.current_status(body)
        patch = st.status_patch(old, fields)
        memory.status = {**old, **fields}
        wanted = asked(body)
        memory.identity = self.metrics.export(body, memory.status, wanted.replicas, wanted.fleet_schedule,
                                              memory.fleet_sites)
        native = memory.status.get("engine") == engine.NATIVE and memory.engine.native_view is not None
        self.metrics.update_native(*memory.identity, memory.engine.sample if native else None)
        if not patch:
            return
        meta = body["metadata"]
        try:
            await self.api.patch_status(naming.STREAM_REPLICATION, meta["namespace"], meta["name"], patch)
        except APINotFoundError:
            return  # deleted meanwhile
        except APIError as err:
            memory.status = old  # not written: try again next time
            log.warning("%s/%s: cannot write status: %s", meta["namespace"], meta["name"], error_text(err))

    async def persist(self, body: Mapping[str, Any], memory: Memory, fields: Mapping[str, Any]) -> None:
        """Write these status fields now (an engine switch's step); None removes a field. Raises
        APIError when they cannot be written: the next step must not run without them."""
        meta = body["metadata"]
        old = memory.current_status(body)
        patch = st.status_patch(old, fields)
        if patch:
            await self.api.patch_status(naming.STREAM_REPLICATION, meta["namespace"], meta["name"], patch)
        memory.status = {k: v for k, v in {**old, **fields}.items() if v is not None}

    def forget(self, memory: Memory) -> None:
        """The resource is gone: its metrics go too."""
        if memory.identity is not None:
            self.metrics.forget(*memory.identity)
