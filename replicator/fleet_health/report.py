"""Plain-text site and fleet tables for the CLI and the demo."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from replicator.fleet_health.job import FleetHealthResult

_COUNTS = ("nodes", "healthy", "timeout", "expired", "unknown")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _row(label: str, counts: Mapping[str, Any]) -> list[str]:
    return [label, *(str(counts.get(c, 0)) for c in _COUNTS), _percent(counts["availability"])]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def format_tables(result: FleetHealthResult) -> str:
    when = datetime.datetime.fromtimestamp(result.run_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    sites = [_row(site["replicator"], site) for site in result.sites]
    fleet = _row(f"fleet ({result.fleet['sites']} sites)", result.fleet)
    header = ["site", *_COUNTS, "availability"]
    table = _table(header, [*sites, fleet])
    # Separate the fleet total from the per-site rows.
    table.insert(len(table) - 1, table[1])
    intro = (
        f"Fleet health run {result.run} at {when}: stream {result.stream} up to sequence "
        f"{result.last_sequence}; read {result.read} advisories ({result.events} new, "
        f"{result.duplicates} duplicate, {result.malformed} malformed)"
    )
    return "\n".join([intro, "", *table])
