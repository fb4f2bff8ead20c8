"""The seams between chart, operator, pods, Prometheus and the dashboard, each checked through
Prometheus's API and the emulator's objects. Every check returns what is broken, in words that
name the seam, so a failing system test says where the parts stopped fitting.

- `unscraped`: every metrics Service (a port named `metrics`) is selected by a rendered
  ServiceMonitor, and each of its Endpoints' addresses is a target that is up;
- `rule_gaps`: every series a rule reads is exported by some target, with every label the rule
  groups, joins or matches by;
- `empty_panels`: every query of the shipped dashboard returns at least one series;
- `active_alerts`: the alerts pending or firing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Any

from tests.support.system import dashboard
from tests.support.system.installed import DASHBOARD, System
from tests.support.system.selection import selects_service, why_not_selected

SERIES = re.compile(r"\bstream_replicator_[a-z_]+")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
# Labels Prometheus itself gives every series or alert, and template placeholders.
BUILTIN = {"__name__", "le", "job", "instance"}


def unscraped(system: System) -> list[str]:
    problems = []
    monitors = system.seen("monitoring.coreos.com/v1", "ServiceMonitor")
    targets = system.prometheus.targets()
    for service in system.seen("v1", "Service"):
        meta = service["metadata"]
        if not any(p.get("name") == "metrics" for p in service["spec"].get("ports") or []):
            continue
        name = f"{meta['namespace']}/{meta['name']}"
        chosen = [m for m in monitors if selects_service(m, service)]
        if not chosen:
            reasons = "; ".join(f"{m['metadata']['name']}: {why_not_selected(m, service)}" for m in monitors)
            problems.append(f"seam ServiceMonitor -> Service: no ServiceMonitor selects {name} ({reasons})")
            continue
        mine = [t for t in targets if t["labels"].get("service") == meta["name"]
                and t["labels"].get("namespace") == meta["namespace"]]
        if not mine:
            problems.append(f"seam Service -> Endpoints -> target: {name} is selected but Prometheus has no target")
        for target in mine:
            if target["health"] != "up":
                problems.append(f"seam target -> /metrics: {target['scrapeUrl']} of {name} is "
                                f"{target['health']}: {target.get('lastError')}")
    return problems


def _labels_read(expr: str) -> set[str]:
    labels = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    for matcher in MATCHERS.findall(expr):
        labels.update(MATCHER_LABEL.findall(matcher))
    return labels - BUILTIN


def _series_labels(system: System, metric: str) -> set[str] | None:
    """Labels of the metric's series as scraped now (a series a target stopped exporting is stale)."""
    found = [s["metric"] for s in system.prometheus.query(f'{{__name__="{metric}"}}')]
    if not found:
        return None
    return {label for series in found for label in series}


def rule_gaps(system: System, absent_ok: Collection[str] = ()) -> list[str]:
    """Rules that read series nobody exports, or labels those series lack (`absent_ok`: metrics
    the scenario has no producer for, by design)."""
    problems = []
    for rule in system.prometheus.rules():
        name, expr = rule.get("name", "?"), rule["query"]
        labels_seen: set[str] = set()
        for metric in sorted(set(SERIES.findall(expr))):
            labels = _series_labels(system, metric)
            if labels is None:
                if metric not in absent_ok:
                    problems.append(f"seam exporter -> rule: {name} reads {metric}, which no target exports")
                continue
            labels_seen |= labels
        if labels_seen:
            missing = _labels_read(expr) - labels_seen
            if missing:
                problems.append(f"seam exporter -> rule: {name} reads label(s) {sorted(missing)} that no series of "
                                f"{sorted(set(SERIES.findall(expr)))} has")
    return problems


def panel_results(system: System, rate_interval: str = "10s",
                  board: dict[str, Any] | None = None) -> list[tuple[dashboard.Query, int]]:
    board = board or dashboard.load(DASHBOARD)
    values = dashboard.variables(board, system.prometheus, rate_interval)
    return [(q, len(system.prometheus.query(dashboard.resolve(q, values)))) for q in dashboard.queries(board)]


def empty_panels(system: System, skip_rows: Iterable[str] = (), board: dict[str, Any] | None = None) -> list[str]:
    """The shipped dashboard's queries (or `board`'s) that return nothing."""
    skip = set(skip_rows)
    return [f"seam exporter -> dashboard: panel {q.row}/{q.panel} ({q.legend or q.expr}) returns no series: {q.expr}"
            for q, count in panel_results(system, board=board) if count == 0 and q.row not in skip]


def active_alerts(system: System) -> list[dict[str, Any]]:
    return [a for a in system.prometheus.alerts() if a["state"] in ("pending", "firing")]


def alert_state(system: System, alert: str, **labels: str) -> str:
    """firing, pending or inactive for the alert with these labels."""
    states = [a["state"] for a in system.prometheus.alerts() if a["labels"].get("alertname") == alert
              and all(a["labels"].get(k) == v for k, v in labels.items())]
    return "firing" if "firing" in states else "pending" if "pending" in states else "inactive"
