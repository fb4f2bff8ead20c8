"""What the operator remembers about one resource between reconcile passes (a cache: a restart
rebuilds it from the resource, its status and its children on resume).

Each part has one writer: the pass (`Reconciler`), what was said (the pass, through `Events`),
what was written (`StatusWriter`) and the engine's state (`EngineSwitch`). The status a pass starts
from and the replicas a resource asks for are derived here, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replication_operator.engine.choice import Choice
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
    engine: EngineMemory = field(default_factory=EngineMemory)

    def current_status(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status as this process last wrote it, else as the resource carries it."""
        return dict(self.status or body.get("status") or {})


def desired_replicas(body: Mapping[str, Any]) -> int:
    """The pods a resource asks for: its typed spec's replicas, or for a spec that cannot be read,
    the raw field (so that status and metrics still say what was asked)."""
    try:
        return parse_spec(body).replicas
    except SpecError:
        return int((body.get("spec") or {}).get("replicas", 1) or 0)
