"""The Kustomize base on deploy/ and the overlay example, rendered by `kubectl kustomize` (kubectl's
own kustomize) and validated: Kubernetes' schemas for built-in kinds, the CRDs' own schemas for kopf's
peering objects, and the operator's argument parser for what its Deployment runs."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_chart_support import REPO
from replication_operator.main import build_parser, check_arguments

OVERLAY = REPO / "examples" / "kustomize" / "overlay"
NAMESPACE = "replication-system"
IMAGE = "registry.example.com/mirror/stream-replicator:0.1.0"


def kustomize(path: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl not found"
    result = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def deploy_objects() -> list[dict[str, Any]]:
    return [doc for p in sorted((REPO / "deploy").glob("*.yaml")) for doc in yaml.safe_load_all(p.read_text()) if doc]


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def validate(objects: list[dict[str, Any]]) -> None:
    crds = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in objects
            if c["kind"] == "CustomResourceDefinition"}
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        if (group, obj["kind"]) in crds:
            (version,) = [v for v in crds[(group, obj["kind"])]["spec"]["versions"] if v["storage"]]
            jsonschema.validate(obj, version["schema"]["openAPIV3Schema"])
        else:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_the_base_is_deploy() -> None:
    base = kustomize(str(REPO / "deploy"))
    assert sorted(map(key, base)) == sorted(map(key, deploy_objects()))
    validate(base)


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return kustomize(str(OVERLAY))


def test_the_overlay_renders_valid_objects(overlay: list[dict[str, Any]]) -> None:
    validate(overlay)


def test_the_overlay_moves_the_namespace(overlay: list[dict[str, Any]]) -> None:
    assert ("Namespace", "", NAMESPACE) in map(key, overlay)
    assert "stream-replicator" not in {o["metadata"]["name"] for o in overlay if o["kind"] == "Namespace"}
    namespaced = [o for o in overlay if o["metadata"].get("namespace") and o["kind"] != "KopfPeering"]
    assert namespaced and {o["metadata"]["namespace"] for o in namespaced} == {NAMESPACE}
    (deployment,) = [o for o in overlay if o["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    bindings = [o for o in overlay if o["kind"] == "ClusterRoleBinding"]
    assert bindings and all({"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in b["subjects"]
                            for b in bindings)


def test_the_overlay_sets_the_images_and_the_watch_scope(overlay: list[dict[str, Any]]) -> None:
    (deployment,) = [o for o in overlay if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAM_REPLICATOR_WORKER_IMAGE"] == IMAGE
    assert env["STREAM_REPLICATOR_SPARK_IMAGE"] == IMAGE + "-spark"
    args = build_parser().parse_args(container["args"])  # what the operator itself accepts
    assert check_arguments(args) is None
    assert args.namespaces == ["team-a", "team-b"] and not args.all_namespaces
    # kopf serving namespaces peers through a KopfPeering of the --peering name in each of them.
    peerings = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in overlay if o["kind"] == "KopfPeering"}
    assert peerings == {(ns, args.peering) for ns in args.namespaces}
