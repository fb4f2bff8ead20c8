"""The shipped Grafana dashboard's queries, as Grafana would send them to Prometheus.

Template variables are resolved as Grafana resolves them: each `label_values(<series>, <label>)`
variable is asked of Prometheus (its series API), in the dashboard's order so later ones see the
earlier ones' values, and set to the values that exist (a regex alternation, as Grafana's multi-value
`=~` does), or to its `allValue` when none exist; `$__rate_interval` is four scrape intervals, Grafana's floor for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.system.prometheus import Prometheus

LABEL_VALUES = re.compile(r"^label_values\((?P<series>.+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    row: str
    panel: str
    legend: str
    expr: str


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def queries(dashboard: dict[str, Any]) -> list[Query]:
    found, row = [], ""
    for panel in dashboard["panels"]:
        inner = (panel.get("panels") or []) if panel.get("type") == "row" else [panel]
        if panel.get("type") == "row":
            row = panel["title"]
        for p in inner:
            for target in p.get("targets") or []:
                found.append(Query(row, p["title"], target.get("legendFormat", ""), target["expr"]))
    return found


def _substitute(text: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        text = text.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    return text


def variables(dashboard: dict[str, Any], prometheus: Prometheus, rate_interval: str) -> dict[str, str]:
    """Each query variable set to the values that exist, as a regex alternation."""
    values: dict[str, str] = {"__rate_interval": rate_interval}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        definition = variable.get("definition") or variable["query"]["query"]
        match = LABEL_VALUES.match(definition.strip())
        if not match:
            raise ValueError(f"unsupported variable query {definition!r}")
        series = _substitute(match["series"], values)
        found = sorted({s.get(match["label"], "") for s in prometheus.api("series", **{"match[]": series})} - {""})
        # A regex in a PromQL string: regex metacharacters escaped, the backslashes escaped again.
        escaped = (re.escape(v).replace("\\", "\\\\") for v in found)
        # None found: Grafana's "All" sends the variable's allValue (`.*` also matches a series without
        # the label, as `cluster` is absent from a Prometheus with no external labels).
        values[variable["name"]] = "|".join(escaped) if found else variable.get("allValue") or "__none__"
    return values


def resolve(query: Query, values: dict[str, str]) -> str:
    return _substitute(query.expr, values)
