"""Fleet health: a PySpark job that folds the advisory stream into node, site and fleet tables.

Importing this package does not import PySpark; the submodules do (`pip install .[spark]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replicator.fleet_health.job import FleetHealthResult, run_fleet_health
    from replicator.fleet_health.report import format_tables
    from replicator.fleet_health.source import JetStreamDataSource

__all__ = ["FleetHealthResult", "JetStreamDataSource", "format_tables", "run_fleet_health"]

_HOMES = {
    "FleetHealthResult": "replicator.fleet_health.job",
    "run_fleet_health": "replicator.fleet_health.job",
    "format_tables": "replicator.fleet_health.report",
    "JetStreamDataSource": "replicator.fleet_health.source",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(name)
