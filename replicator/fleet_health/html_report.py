"""`stream-replicator fleet-health report --html FILE`: one self-contained page from the job's history.

Charts are Plotly figures with plotly.js inlined once in the page, so the file opens anywhere with
no network (a browser on an air-gapped bastion, an attachment): availability per site over the runs,
the advisories each run took in, and the node table of the last run, least healthy first.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from replicator.fleet_health.history import Counts, History, read_history

EVENT_COLOURS = {"new": "#4c78a8", "recover": "#54a24b", "timeout": "#f58518", "expire": "#9d755d",
                 "duplicate": "#bab0ac", "malformed": "#e45756"}
STATE_ORDER = {"timeout": 0, "unknown": 1, "expired": 2, "healthy": 3}
NODE_COLUMNS = ("replicator", "value", "state", "last_event", "last_event_time", "timeouts", "recoveries",
                "expiries", "downtime_seconds")
NODE_HEADERS = ("site", "node", "state", "last advisory", "at (UTC)", "timeouts", "recoveries", "expiries",
                "downtime")
DEFAULT_MAX_NODES = 1000

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.meta { color: #555; } .tiles { display: flex; gap: 12px; flex-wrap: wrap; margin: 16px 0; }
.tile { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
.tile b { display: block; font-size: 1.4em; } .tile span { color: #555; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.85em; } th, td { padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; position: sticky; top: 0; } td.text, th.text { text-align: left; }
tr:nth-child(even) td { background: #fafafa; } .timeout { color: #c55a00; font-weight: 600; }
.expired { color: #777; } .unknown { color: #6a51a3; font-style: italic; }
.healthy { color: #2e7d32; } .note { color: #555; font-size: 0.85em; }
"""


def _when(stamp: int | None) -> str:
    if stamp is None:
        return ""
    return dt.datetime.fromtimestamp(int(stamp), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _duration(seconds: int | None) -> str:
    if not seconds:
        return "0s"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return " ".join(parts[:2])


def availability_figure(history: History) -> Any:
    times = [dt.datetime.fromtimestamp(r.run_time, dt.UTC) for r in history.runs]
    runs = [r.run for r in history.runs]
    fig = go.Figure()

    def trace(name: str, series: Sequence[Counts], **style: Any) -> None:
        fig.add_trace(go.Scatter(
            x=times, y=[c.availability for c in series], name=name, mode="lines+markers",
            customdata=[[run, c.healthy, c.timeout, c.expired] for run, c in zip(runs, series, strict=True)],
            hovertemplate=(f"<b>{html.escape(name)}</b><br>run %{{customdata[0]}}, %{{x}}<br>availability "
                           "%{y:.2%}<br>healthy %{customdata[1]}, timeout %{customdata[2]}, expired "
                           "%{customdata[3]}<extra></extra>"),
            **style))

    for site, series in history.sites.items():
        trace(site, series)
    trace("fleet", [history.fleet(i) for i in range(len(history.runs))],
          line={"color": "#222", "width": 3, "dash": "dash"})
    # Some room either side, so that a single run (or runs seconds apart) still reads as times.
    pad = dt.timedelta(seconds=max(60.0, (times[-1] - times[0]).total_seconds() * 0.05))
    fig.update_layout(title="Availability per site: healthy / (healthy + timeout) after each run",
                      yaxis={"tickformat": ".0%", "range": [0, 1.05], "title": "availability"},
                      xaxis={"title": "run time (UTC)", "range": [times[0] - pad, times[-1] + pad]},
                      legend={"title": "site"},
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, height=420, template="plotly_white")
    return fig


def advisories_figure(history: History) -> Any:
    labels = [f"run {r.run}<br>{_when(r.run_time)}" for r in history.runs]
    fig = go.Figure()
    kinds: list[tuple[str, list[int]]] = [(e, [r.by_event.get(e, 0) for r in history.runs])
                                          for e in ("new", "recover", "timeout", "expire")]
    kinds += [("duplicate", [r.duplicates for r in history.runs]), ("malformed", [r.malformed for r in history.runs])]
    for kind, counts in kinds:
        fig.add_trace(go.Bar(x=labels, y=counts, name=kind, marker={"color": EVENT_COLOURS[kind]},
                             hovertemplate=f"{kind}: %{{y}}<extra>%{{x}}</extra>"))
    fig.update_layout(barmode="stack", title="Advisories each run read, by event (duplicates and malformed "
                                             "messages were skipped)",
                      yaxis={"title": "advisories"}, margin={"l": 60, "r": 20, "t": 50, "b": 80}, height=380,
                      template="plotly_white", legend={"title": "advisory"})
    return fig


def _node_rows(nodes: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Least healthy first: timed out (longest downtime first), unknown (a timeout inside a blind
    spot), expired, then healthy."""
    ordered = sorted(nodes, key=lambda n: (STATE_ORDER.get(str(n["state"]), 4), -int(n["downtime_seconds"] or 0),
                                           str(n["replicator"]), str(n["value"])))
    return ordered[:limit]


def _cell(column: str, value: Any) -> str:
    if column == "last_event_time":
        return f"<td>{_when(value)}</td>"
    if column == "downtime_seconds":
        return f"<td>{_duration(value)}</td>"
    if column == "state":
        return f'<td class="text {html.escape(str(value))}">{html.escape(str(value))}</td>'
    if column in ("replicator", "value", "last_event"):
        return f'<td class="text">{html.escape(str(value))}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def node_table(history: History, limit: int) -> str:
    rows = _node_rows(history.nodes, limit)
    head = "".join(f'<th class="{"text" if i < 4 else ""}">{h}</th>' for i, h in enumerate(NODE_HEADERS))
    body = "\n".join("<tr>" + "".join(_cell(c, node[c]) for c in NODE_COLUMNS) + "</tr>" for node in rows)
    note = (f'<p class="note">The {len(rows)} least healthy of {len(history.nodes)} nodes; all of them are in '
            f"<code>{html.escape(history.output)}/nodes</code>.</p>" if len(rows) < len(history.nodes) else "")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>{note}"


def _tiles(history: History) -> str:
    fleet = history.fleet()
    # The runs' counts are rebuilt from the advisories; the job's node table knows the blind spots.
    unknown = sum(1 for n in history.nodes if n.get("state") == "unknown")
    tiles = [("availability", _percent(fleet.availability)), ("nodes", str(fleet.nodes)),
             ("healthy", str(fleet.healthy)), ("timeout", str(fleet.timeout - unknown)), ("unknown", str(unknown)),
             ("expired", str(fleet.expired)),
             ("sites", str(sum(1 for c in history.sites.values() if c[-1].nodes))), ("runs", str(len(history.runs)))]
    return '<div class="tiles">' + "".join(f"<div class=\"tile\"><b>{v}</b><span>{k}</span></div>"
                                           for k, v in tiles) + "</div>"


def render(history: History, *, max_nodes: int = DEFAULT_MAX_NODES, title: str = "Fleet health") -> str:
    """The whole page as one string: inline CSS, plotly.js inlined once, no external reference."""
    last = history.runs[-1]
    config = {"displaylogo": False, "responsive": True}
    charts = "\n".join(fig.to_html(full_html=False, include_plotlyjs=False, config=config)
                       for fig in (availability_figure(history), advisories_figure(history)))
    meta = (f"Stream <b>{html.escape(history.stream)}</b>, {len(history.runs)} runs; the last, run {last.run}, at "
            f"{_when(last.run_time)} UTC. From <code>{html.escape(history.output)}</code>.")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<p class="meta">{meta}</p>
{_tiles(history)}
<h2>Availability over time</h2>
{charts}
<h2>Nodes after run {last.run}</h2>
{node_table(history, max_nodes)}
</body></html>
"""


def write_report(output: str, path: Path, *, max_nodes: int = DEFAULT_MAX_NODES) -> History:
    history = read_history(output)
    page = render(history, max_nodes=max_nodes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return history
