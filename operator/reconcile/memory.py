"""What the operator remembers about one resource between reconcile passes (a cache: a restart
rebuilds it from the resource, its status and its children on resume).

Each part has one writer: the pass (`Reconciler`), what was said (the pass, through `Events`),
what was written (`StatusWriter`) and the engine's state (`EngineSwitch`). The status a pass starts
from and what a resource asks for (`asked`, also of a spec that cannot be read) are derived here,
once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replication_operator.engine.choice import Choice
from replication_operator.engine.health import Progress
from replication_operator.metrics import NativeSample
from replication_operator.model import status as st
from replication_operator.model.spec import SpecError, parse_spec

Said = tuple[tuple[str, str], ...]  # (reason, message) pairs already posted as Events


@dataclass
class EngineMemory:
    """The engine switch's own state (reconcile/engine_switch.py writes it, the pass reads it)."""

    choice: Choice | None = None
    choice_generation: int | None = None  # the spec generation the choice was made for
    native_view: st.Native | None = None  # the native engine runs: what it saw of its entry
    native_fields: dict[str, Any] = field(default_factory=dict)  # lag, lastActive
    sample: NativeSample | None = None  # the native entry's last measures (metrics)
    progress: Progress | None = None  # when the native entry last moved or was caught up
    awaiting_pods: bool = False  # switching to native: the worker Deployment is being deleted
    children_gone: bool = False  # native: the replicator's other children were deleted


@dataclass
class Memory:
    """What the operator remembers about one resource between passes."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The pass: its problems, the generation it saw, when it last ran in full.
    problems: list[st.Problem] = field(default_factory=list)
    observed_generation: int | None = None
    last_full: float = 0.0
    # Certificates in the mounted TLS Secrets.
    certificates: list[st.MountedCertificate] = field(default_factory=list)
    # What was said in Events, so that each thing is said once.
    posted: Said = ()
    advised: Said = ()  # the advice last posted (checks/advice.py)
    nats_errors: dict[str, str] = field(default_factory=dict)
    certificate_warning: str | None = None  # the CertificatesExpiring message last posted
    # What the status writer last wrote.
    status: dict[str, Any] = field(default_factory=dict)
    identity: tuple[str, str] | None = None  # (namespace, name), once a status was written (metrics)
    fleet_sites: tuple[dict[str, Any], ...] = ()  # the last fleet summary's site rows (metrics only)
    copy_loop: str | None = None  # the workers' loop notes on their consumer (None: never any)
    engine: EngineMemory = field(default_factory=EngineMemory)
    paused: bool | None = None  # the pause annotation at the last pass (None: no pass yet)

    def current_status(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status as this process last wrote it, else as the resource carries it."""
        return dict(self.status or body.get("status") or {})


@dataclass(frozen=True)
class Asked:
    """What status and metrics report a resource asks for: its pods, and the schedule of its
    fleet-health job ("" for the default, None without one)."""

    replicas: int
    fleet_schedule: str | None


def asked(body: Mapping[str, Any]) -> Asked:
    """From the typed spec; from the raw fields when the spec cannot be read, so that status and
    metrics still say what was asked while the resource is Degraded."""
    try:
        spec = parse_spec(body)
    except SpecError:
        raw = body.get("spec") or {}
        fleet = raw.get("fleetHealth")
        schedule = str(fleet.get("schedule") or "") if isinstance(fleet, Mapping) else None
        return Asked(int(raw.get("replicas", 1) or 0), schedule)
    return Asked(spec.replicas, (spec.fleet_health.schedule or "") if spec.fleet_health else None)
