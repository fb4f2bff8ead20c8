"""Helpers for the chart tests: render the chart with the real Helm engine and read what it made.

Also the operator's RBAC contract (`EXPECTED_*`, `expected_rbac`), so the test of the operator's real
API calls (tests/operator/test_operator_rbac.py) compares against the same list the chart is checked with.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "stream-replicator"
RELEASE = "sr"
RELEASE_NAMESPACE = "ops"

# Every child may be deleted: optional ones when the spec drops them, all when the native engine takes over.
CHILDREN = frozenset({"get", "list", "watch", "create", "patch", "delete"})
PEERING = frozenset({"list", "watch", "patch"})  # kopf watches and patches it, never reads it by name

# (apiGroup, resource) -> verbs. Namespaced resources: granted in each served namespace (or cluster-wide).
EXPECTED_NAMESPACED: dict[tuple[str, str], frozenset[str]] = {
    ("streamreplicator.io", "streamreplications"): frozenset({"get", "list", "watch", "patch"}),
    ("streamreplicator.io", "streamreplications/status"): frozenset({"patch"}),
    ("streamreplicator.io", "natsconnections"): frozenset({"get", "list", "watch"}),  # shared connections
    ("streamreplicator.io", "natsconnections/status"): frozenset({"patch"}),
    ("", "configmaps"): CHILDREN,
    ("", "services"): CHILDREN,
    ("apps", "deployments"): CHILDREN,
    ("policy", "poddisruptionbudgets"): CHILDREN,
    ("monitoring.coreos.com", "servicemonitors"): CHILDREN,
    ("networking.k8s.io", "networkpolicies"): CHILDREN,
    ("sparkoperator.k8s.io", "scheduledsparkapplications"): CHILDREN,
    ("", "secrets"): frozenset({"get"}),
    ("", "events"): frozenset({"create"}),
}
# Cluster-scoped resources: always a ClusterRole.
EXPECTED_CLUSTER: dict[tuple[str, str], frozenset[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
}
# kopf tracks namespaces only when it serves chosen ones (cluster-wide operators never list them).
EXPECTED_NAMESPACE_TRACKING = {("", "namespaces"): frozenset({"list", "watch"})}
# kopf peering, by the operator's mode.
EXPECTED_CLUSTER_PEERING = {("kopf.dev", "clusterkopfpeerings"): PEERING}
EXPECTED_NAMESPACED_PEERING = {("kopf.dev", "kopfpeerings"): PEERING}


def expected_rbac(*, clusterwide: bool, peering: bool = True, roles_only: bool = False) -> tuple[dict, dict]:
    """(cluster-scoped, namespaced) permissions the operator needs in a mode; `roles_only`
    (`--roles-only`) makes no cluster-scoped call."""
    cluster = {} if roles_only else dict(EXPECTED_CLUSTER)
    namespaced = dict(EXPECTED_NAMESPACED)
    if not clusterwide and not roles_only:
        cluster.update(EXPECTED_NAMESPACE_TRACKING)
    if peering and clusterwide:
        cluster.update(EXPECTED_CLUSTER_PEERING)
    if peering and not clusterwide:
        namespaced.update(EXPECTED_NAMESPACED_PEERING)
    return cluster, namespaced


_chart: helm.Chart | None = None


def chart() -> helm.Chart:
    """The chart, loaded once per test session (charts are immutable)."""
    global _chart
    if _chart is None:
        _chart = helm.Chart.load(CHART_DIR)
    return _chart


def render_files(values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE) -> dict[str, str]:
    return chart().render(values, name=RELEASE, namespace=namespace, is_install=True)


def render(values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (templates only; CRDs are in `crds()`)."""
    objects = []
    for path, text in sorted(render_files(values, namespace).items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


def crds() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for crd in chart().crds:
        docs.extend(d for d in yaml.safe_load_all(crd["data"]) if d)
    return docs


def find(objects: Iterable[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Iterable[dict], kind: str) -> dict:
    found = find(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def permissions(rules: list[dict]) -> dict[tuple[str, str], frozenset[str]]:
    """PolicyRules flattened to (apiGroup, resource) -> verbs; wildcards are refused."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return {k: frozenset(v) for k, v in granted.items()}


def operator_roles(objects: Iterable[dict], kind: str) -> list[dict]:
    """The operator's (Cluster)Roles, not the ones for people (`user-roles`, aggregated)."""
    return [o for o in find(objects, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"]


def rbac_rules(values: dict[str, Any] | None = None) -> dict[str, list[dict]]:
    """The operator's rendered rules: {"cluster": [...], "<namespace>": [...]} (Roles by namespace)."""
    objects = render(values)
    rules: dict[str, list[dict]] = {}
    for role in operator_roles(objects, "ClusterRole"):
        rules.setdefault("cluster", []).extend(role["rules"])
    for role in find(objects, "Role"):
        rules.setdefault(role["metadata"]["namespace"], []).extend(role["rules"])
    return rules
