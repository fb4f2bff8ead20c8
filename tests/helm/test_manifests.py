"""deploy/, the plain manifests for installing without Helm: equal to what the chart renders
(`make manifests`), and holding everything the operator's default peering needs."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import yaml
from helm_chart_support import REPO


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_manifests", REPO / "helm" / "generate_manifests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _deployed() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((REPO / "deploy").glob("*.yaml"))}


def _objects() -> list[dict[str, Any]]:
    return [doc for text in _deployed().values() for doc in yaml.safe_load_all(text) if doc]


def test_deploy_is_what_the_chart_renders() -> None:
    assert _deployed() == _generator().manifests(), "deploy/ differs from the chart: run `make manifests`"


def test_deploy_holds_what_the_default_peering_needs() -> None:
    objects = _objects()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    crd_names = {name for kind, name in kinds if kind == "CustomResourceDefinition"}
    assert crd_names == {"streamreplications.streamreplicator.io", "natsconnections.streamreplicator.io",
                         "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    peering = next(a.split("=", 1)[1] for a in args if a.startswith("--peering="))
    assert ("ClusterKopfPeering", peering) in kinds, "the operator's --peering object is not in deploy/"
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in kinds
    bound = [o for o in objects if o["kind"] == "ClusterRoleBinding"
             and any(s["name"] == account for s in o["subjects"])]
    assert bound, "no ClusterRoleBinding for the operator's service account"
    namespace = deployment["metadata"]["namespace"]
    assert ("Namespace", namespace) in kinds


def test_crds_are_applied_before_the_objects_that_need_them() -> None:
    """kubectl applies a folder in name order; the peering object needs its CRD established first."""
    kinds = [{d["kind"] for d in yaml.safe_load_all(text) if d} for text in _deployed().values()]
    last_crd = max(i for i, found in enumerate(kinds) if "CustomResourceDefinition" in found)
    first_custom = min(i for i, found in enumerate(kinds) if found & {"ClusterKopfPeering", "KopfPeering"})
    assert "CustomResourceDefinition" not in kinds[first_custom] and last_crd < first_custom
