"""The Grafana dashboard queries only metrics the worker or the operator really exports, with their
real labels.

The reference is the exposition of a real `replicator.metrics.Metrics()` registry with one worker's
samples and of the operator's registry with one resource's fleet summary, as Prometheus would scrape
them. Worker series are filtered by `$name` and `$worker`, the operator's by `$namespace` and
`$streamreplication`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helm_chart_support import CHART_DIR, REPO
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from replication_operator.metrics import FLEET, NATIVE_METRIC_NAMES, NativeSample, OperatorMetrics

from replicator.observe.metrics import METRIC_NAMES, PREFIX, Metrics

DASHBOARD = REPO / "dashboards" / "stream-replicator.json"
CHART_DASHBOARD = CHART_DIR / "dashboards" / "stream-replicator.json"

# PromQL keywords that read like identifiers (functions are recognised by their "(").
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}
IDENT = r"[A-Za-z_:][A-Za-z0-9_:]*"
FILTERS = {"worker": ('cluster=~"$cluster"', 'namespace=~"$namespace"', 'name=~"$name"', 'worker=~"$worker"'),
           "operator": ('cluster=~"$cluster"', 'namespace=~"$namespace"', 'streamreplication=~"$streamreplication"')}
# Labels the scrape adds, not the exposition: `namespace` (the pod's, from the ServiceMonitor's or
# kubernetes_sd's target labels; the operator's own series carry it with honorLabels) and `cluster`
# (the external label of each cluster's Prometheus, in the Thanos/Mimir/federation a fleet of clusters
# is read through; `cluster=~".*"` also matches a series without it).
SCRAPE_LABELS = {"namespace", "cluster"}


def _samples(text: str) -> dict[str, set[str]]:
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def worker_exposition() -> dict[str, set[str]]:
    """Sample name -> label names, from a real registry with one worker's samples."""
    metrics = Metrics()
    worker = metrics.worker("cmdb", "cmdb_0")
    worker.received_msgs.inc()
    worker.processing_time.observe(0.002)
    worker.lag_msgs.set(3)
    worker.certificate("target", "client", lambda: 1.9e9)  # exported only for sides with TLS
    worker.write_path("batch")
    return _samples(generate_latest(metrics.registry).decode())


def operator_exposition() -> dict[str, set[str]]:
    """The same from the operator's registry, with one resource's fleet summary of two sites."""
    metrics = OperatorMetrics()
    fleet = {"nodes": 5, "healthy": 3, "timeout": 1, "expired": 1, "availability": 0.75,
             "lastRun": "2026-01-01T00:00:00Z"}
    sites = [{"site": "ams", "nodes": 3, "healthy": 2, "timeout": 1, "expired": 0, "availability": 2 / 3},
             {"site": "fra", "nodes": 2, "healthy": 1, "timeout": 0, "expired": 1, "availability": 1.0}]
    metrics.update("prod", "registrations", desired=2, status={"readyReplicas": 2, "fleet": fleet},
                   created=None, fleet_interval=900.0, sites=sites)
    metrics.update_native("prod", "edge", NativeSample("prod_edge", lag=3, current=10, inactive=0.0, error=False))
    return _samples(generate_latest(metrics.registry).decode())


def exposition() -> dict[str, set[str]]:
    return {**worker_exposition(), **operator_exposition()}


def origin(metric: str) -> str:
    """Whose variables filter a series: the operator's own gauges carry `streamreplication`; its
    native-engine series carry the workers' `name` and `worker`."""
    return "operator" if "streamreplication" in operator_exposition().get(metric, set()) else "worker"


def sample_family(sample: str) -> str:
    for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
        if sample.endswith(suffix) and sample.removesuffix(suffix) in METRIC_NAMES:
            return sample.removesuffix(suffix)
    return sample


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    names = set()
    for match in re.finditer(IDENT, s):
        word = match.group()
        if word in KEYWORDS or re.match(r"\s*\(", s[match.end() :]):
            continue  # a keyword or a function call
        if match.start() > 0 and s[match.start() - 1] in "0123456789.$":
            continue  # part of a number or a variable
        names.add(word)
    return names


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    return labels


def matcher_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"(" + IDENT + r")\s*(?:=~|!~|!=|=)", body))
    return labels


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def targets(dashboard: dict) -> list[dict]:
    return [t for p in panels(dashboard) for t in p.get("targets", [])]


def variable(dashboard: dict, name: str) -> dict:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    return found


def test_chart_ships_the_same_dashboard() -> None:
    assert CHART_DASHBOARD.read_bytes() == DASHBOARD.read_bytes(), (
        "the chart's dashboard differs from dashboards/stream-replicator.json: copy it into the chart"
    )


def test_expression_parser() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le, name) (rate(stream_replicator_processing_time_bucket"
        '{name=~"$name", worker=~"$worker"}[$__rate_interval]))) / on (name) group_left x_total offset 5m'
    )
    assert metric_names(expr) == {"stream_replicator_processing_time_bucket", "x_total"}
    assert grouping_labels(expr) == {"le", "name"}
    assert matcher_labels(expr) == {"name", "worker"}


def test_every_queried_metric_is_exported_with_its_labels() -> None:
    exported = exposition()
    dashboard = load()
    exprs = [t["expr"] for t in targets(dashboard)]
    assert len(exprs) >= 20
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for name in names:
            assert name in exported, f"{name} (in {expr!r}) is not exported by the worker"
            labels = exported[name] | SCRAPE_LABELS
            assert matcher_labels(expr) <= labels, expr
            assert grouping_labels(expr) <= labels, expr
        # Every series is filtered by the dashboard's variables: the worker's or the operator's.
        selectors = re.findall(r"(" + IDENT + r")\{([^}]*)\}", expr)
        assert len(selectors) == expr.count("{"), expr
        for metric, body in selectors:
            assert all(f in body for f in FILTERS[origin(metric)]), (metric, body)


def test_counters_are_rated_and_gauges_are_not() -> None:
    for expr in (t["expr"] for t in targets(load())):
        for name in metric_names(expr):
            rated = re.search(r"rate\(\s*" + re.escape(name) + r"\{", expr) is not None
            assert rated == name.endswith(("_total", "_bucket", "_sum", "_count")), expr


def test_every_exported_metric_is_on_the_dashboard() -> None:
    """Every worker metric, and every fleet-health gauge of the operator (its replica gauges are for
    alerts, the workers' own panels show the pods)."""
    shown = {sample_family(n) for t in targets(load()) for n in metric_names(t["expr"])}
    assert set(METRIC_NAMES) - shown == set()
    assert {PREFIX + n for n in FLEET} - shown == set()
    assert set(NATIVE_METRIC_NAMES) - shown == set()


def test_variables_query_exported_labels() -> None:
    exported = exposition()
    dashboard = load()
    for name in ("cluster", "namespace", "name", "worker", "streamreplication"):
        var = variable(dashboard, name)
        assert var["type"] == "query"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((" + IDENT + r")(\{[^}]*\})?,\s*(" + IDENT + r")\)", query)
        assert match, query
        metric, _, label = match.groups()
        assert label == name
        assert metric in exported and label in exported[metric] | SCRAPE_LABELS
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".*"
    order = [v["name"] for v in dashboard["templating"]["list"]]
    assert order == ["datasource", "cluster", "namespace", "name", "worker", "streamreplication"]
    datasource = variable(dashboard, "datasource")
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"


def test_series_of_one_name_in_two_namespaces_or_clusters_stay_apart() -> None:
    """Every city is told to use the same `name`: a panel that aggregates by name keeps the
    namespace and the cluster, so their series do not merge."""
    for expr in (t["expr"] for t in targets(load())):
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",")}
            if labels & {"name", "streamreplication"}:
                assert {"cluster", "namespace"} <= labels, expr


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    """`promtool check rules` parses each query, the variables replaced as Grafana does."""
    binary = shutil.which("promtool")
    assert binary, "promtool not found: install the Debian package prometheus (.ci/run does)"
    rules = []
    for i, target in enumerate(targets(load())):
        expr = target["expr"].replace("$__rate_interval", "5m")
        expr = re.sub(r"\$(" + IDENT + r")", ".*", expr)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([binary, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_dashboard_structure() -> None:
    dashboard = load()
    assert dashboard["uid"] == "stream-replicator"
    assert 36 <= dashboard["schemaVersion"] <= 41
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        cells = {(pos["y"] + dy, pos["x"] + dx) for dy in range(pos["h"]) for dx in range(pos["w"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel.get("description")
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"]
    refs = [(p["id"], t["refId"]) for p in panels(dashboard) for t in p.get("targets", [])]
    assert len(refs) == len(set(refs))
    titles = {p["title"] for p in panels(dashboard)}
    for expected in (
        "Messages",
        "Bytes",
        "Lag by replication",
        "Processing time quantiles",
        "Failures",
        "Connections",
        "Advisories by event",
        "Leader",
        "Fleet availability",
        "Availability by site",
        "Fleet nodes by state",
    ):
        assert expected in titles


@pytest.mark.parametrize("path", [DASHBOARD, CHART_DASHBOARD], ids=["repo", "chart"])
def test_dashboard_is_plain_json_without_import_placeholders(path: Path) -> None:
    text = path.read_text()
    assert "__inputs" not in text and "${DS_" not in text  # provisioned by the sidecar, not imported
    json.loads(text)
