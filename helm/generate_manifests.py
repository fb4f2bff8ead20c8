"""Plain manifests for installing without Helm (`make manifests` writes deploy/).

Rendered from the chart by the real Helm engine with the chart's defaults (release
`stream-replicator` in namespace `stream-replicator`), so they hold exactly what `helm install`
would create: the CRDs (kopf's peering CRDs included), the ServiceAccount, RBAC, the operator
Deployment and the peering object. Only the dashboard ConfigMap is left out (Grafana users take
`dashboards/` or the chart). tests/helm/test_manifests.py fails while deploy/ differs from this.

    python helm/generate_manifests.py [DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART_DIR = REPO / "helm" / "stream-replicator"
DEPLOY_DIR = REPO / "deploy"
RELEASE = "stream-replicator"
NAMESPACE = "stream-replicator"
VALUES: dict[str, Any] = {"dashboards": {"enabled": False}}
HEADER = "# Generated from helm/stream-replicator by `make manifests` (helm/generate_manifests.py): do not edit.\n"


def _documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _dump(documents: list[dict[str, Any]]) -> str:
    return HEADER + "".join("---\n" + yaml.safe_dump(doc, sort_keys=False) for doc in documents)


def namespace() -> dict[str, Any]:
    """The release namespace, which `helm install --create-namespace` would create."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def crds(chart: helm.Chart) -> list[dict[str, Any]]:
    """The chart's crds/ folder: StreamReplication and kopf's KopfPeering/ClusterKopfPeering."""
    docs: list[dict[str, Any]] = []
    for crd in sorted(chart.crds, key=lambda c: c["name"]):
        docs.extend(_documents(crd["data"]))
    return docs


def operator(chart: helm.Chart) -> list[dict[str, Any]]:
    """Every template the defaults render, in Helm's file order (NOTES.txt left out)."""
    rendered = chart.render(VALUES, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith((".yaml", ".yml")):
            docs.extend(_documents(text))
    return docs


def manifests() -> dict[str, str]:
    """File name -> text; applied in name order (CRDs established before the peering object)."""
    chart = helm.Chart.load(CHART_DIR)
    return {
        "00-namespace.yaml": _dump([namespace()]),
        "01-crds.yaml": _dump(crds(chart)),
        "02-operator.yaml": _dump(operator(chart)),
    }


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEPLOY_DIR
    out.mkdir(parents=True, exist_ok=True)
    wanted = manifests()
    for stale in out.glob("*.yaml"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (out / name).write_text(text)
    print(f"wrote {', '.join(sorted(wanted))} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
