"""What the operator remembers about one resource between reconcile passes (a cache: a restart
rebuilds it from the resource, its status and its children on resume)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from replication_operator.engine.choice import Choice
from replication_operator.model import status as st


@dataclass
class Memory:
    """What the operator remembers about one resource between passes."""

    problems: list[st.Problem] = field(default_factory=list)
    posted: tuple[tuple[str, str], ...] = ()
    advised: tuple[tuple[str, str], ...] = ()  # the advice last posted (operator/advice.py)
    observed_generation: int | None = None
    status: dict[str, Any] = field(default_factory=dict)
    last_full: float = 0.0
    nats_errors: dict[str, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Certificates in the mounted TLS Secrets, and the CertificatesExpiring message last posted.
    certificates: list[st.MountedCertificate] = field(default_factory=list)
    certificate_warning: str | None = None
    identity: tuple[str, str] | None = None  # (namespace, name), once a status was written (metrics)
    fleet_sites: tuple[dict[str, Any], ...] = ()  # the last fleet summary's site rows (metrics only)
    # The engine: the choice (and the spec generation it was made for), the native engine's view.
    choice: Choice | None = None
    choice_generation: int | None = None
    native_view: st.Native | None = None
    native_fields: dict[str, Any] = field(default_factory=dict)  # lag, lastActive
    awaiting_pods: bool = False  # switching to native: the worker Deployment is being deleted
    children_gone: bool = False  # native: the replicator's other children were deleted
