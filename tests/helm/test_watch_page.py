"""docs/what-the-chart-watches.md names every alert and dashboard panel the chart ships, with the
series each reads (as the rendered PrometheusRule and the shipped dashboard read them)."""

from __future__ import annotations

import json
import re

from helm_chart_support import CHART_DIR, REPO, find, one, render

PAGE = REPO / "docs" / "what-the-chart-watches.md"
SERIES = re.compile(r"\bstream_replicator_[a-z_]+")


def _rows() -> dict[str, str]:
    """First cell that names an alert or panel -> its whole table row."""
    rows: dict[str, str] = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4:
            key = cells[1] if cells[0] in _row_titles() else cells[0]
            rows[f"{cells[0]}/{key}" if cells[0] in _row_titles() else key] = line
    return rows


def _dashboard() -> dict:
    return json.loads((CHART_DIR / "dashboards" / "stream-replicator.json").read_text())


def _row_titles() -> set[str]:
    return {p["title"] for p in _dashboard()["panels"] if p.get("type") == "row"}


def _panels() -> list[tuple[str, dict]]:
    found, row = [], ""
    for panel in _dashboard()["panels"]:
        if panel.get("type") == "row":
            row = panel["title"]
            inner = panel.get("panels") or []
        else:
            inner = [panel]
        found.extend((row, p) for p in inner)
    return found


def _named(row: str, series: set[str]) -> set[str]:
    """Series a row names, with `_suffix` abbreviations expanded against the series wanted."""
    named = set(SERIES.findall(row))
    for short in re.findall(r"`(_[a-z_]+)", row):
        named.update(s for s in series if s.endswith(short))
    return named


def test_every_alert_is_on_the_page_with_the_series_it_reads() -> None:
    rule = one(render({"metrics": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    rows = _rows()
    for alert in (r for group in rule["spec"]["groups"] for r in group["rules"]):
        assert alert["alert"] in rows, f"{alert['alert']} is missing from {PAGE.name}"
        read = set(SERIES.findall(alert["expr"]))
        assert read <= _named(rows[alert["alert"]], read), (alert["alert"], read)


def test_every_dashboard_panel_is_on_the_page_with_the_series_it_reads() -> None:
    rows = _rows()
    for row, panel in _panels():
        key = f"{row}/{panel['title']}"
        assert key in rows, f"panel {key} is missing from {PAGE.name}"
        read = {re.sub(r"_(bucket|sum|count)$", "", s) for t in panel.get("targets", [])
                for s in SERIES.findall(t["expr"])}
        named = {re.sub(r"_(bucket|sum|count)$", "", s) for s in _named(rows[key], read)}
        assert read <= named, (key, read - named)


def test_the_page_names_the_monitors_the_chart_renders() -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True}}}
    text = PAGE.read_text()
    for monitor in find(render(values), "ServiceMonitor"):
        name = monitor["metadata"]["name"]
        assert f"`{name}`" in text, name
