"""The Helm chart, linted and rendered by the real Helm engine (helm-python-sdk), and every rendered
object validated against the Kubernetes OpenAPI schemas (kubernetes-validate)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import textwrap
import tomllib
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_chart_support import (
    CHART_DIR,
    RELEASE,
    RELEASE_NAMESPACE,
    REPO,
    chart,
    crds,
    expected_rbac,
    find,
    one,
    operator_roles,
    permissions,
    render,
    render_files,
)
from replication_operator.model import images

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas we have.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "KopfPeering", "ClusterKopfPeering"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "CustomResourceDefinition"}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced-rbac": {"rbac": {"namespaced": True}, "operator": {"namespaces": ["team-a", "team-b"]}},
    "namespaced-rbac-release-namespace": {"rbac": {"namespaced": True}},
    "cluster-rbac-some-namespaces": {"operator": {"namespaces": ["team-a"]}},
    "standalone": {"peering": {"enabled": False}},
    "service-monitor": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "scrapeTimeout": "10s"}
        }
    },
    "prometheus-rule": {
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}, "alertLabels": {"team": "nats"}},
        }
    },
    "service-monitor-namespaced": {
        "rbac": {"namespaced": True},
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "1m"}},
    },
    "pdb": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}},
    "pdb-min-available": {"podDisruptionBudget": {"enabled": True, "minAvailable": "50%"}},
    "dashboards-off": {"dashboards": {"enabled": False}},
    "dashboards-elsewhere": {
        "dashboards": {
            "namespace": "monitoring",
            "labelValue": "stream",
            "annotations": {"grafana_folder": "NATS"},
        }
    },
    "custom-image": {
        "image": {"repository": "registry.example.com/team/sr", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "workerImage": {"repository": "registry.example.com/team/sr-worker", "tag": ""},
        "sparkImage": {"repository": "", "tag": "spark-7"},
    },
    "scheduling-and-extras": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "nats"},
        "podLabels": {"team": "nats"},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "operator": {
            "extraArgs": ["--verbose"],
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
            "healthPort": 9090,
        },
        "serviceAccount": {"annotations": {"iam.example.com/role": "sr"}},
    },
    "existing-service-account-no-rbac": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "custom-sa"},
    },
    "fullname-override": {"fullnameOverride": "replicator-operator", "peering": {"name": "fleet"}},
    "roles-only": {"rbac": {"namespaced": True, "rolesOnly": True}, "operator": {"namespaces": ["team-a"]}},
    "no-aggregated-roles": {"rbac": {"aggregateToDefaultRoles": False}},
    "policy": {
        "policy": {
            "allowedImages": ["registry.example.net/team/*"],
            "allowedServiceAccounts": ["sr-worker", "team-a/special"],
            "unlabelledSecretsNamespaces": ["sandbox-*"],
            "allowedNatsHosts": ["*.nats.example.net", "10.20.0.0/16"],
            "allowedSparkConf": ["spark.hadoop.*", "spark.sql.shuffle.partitions"],
            "allowedSparkPackages": ["org.apache.hadoop:hadoop-aws:3.5.0"],
        }
    },
}


def deployment(values: dict[str, Any] | None = None) -> dict:
    return one(render(values), "Deployment")


def container(values: dict[str, Any] | None = None) -> dict:
    containers = deployment(values)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env(c: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# --------------------------------------------------------------------------------------------------
# Chart metadata and lint


def test_chart_metadata_follows_the_project() -> None:
    meta = chart().metadata
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "stream-replicator"
    assert meta["appVersion"] == pyproject["project"]["version"]
    assert chart().schema is not None


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_passes(name: str) -> None:
    report = helm.lint(CHART_DIR, VALUE_SETS[name], strict=True, namespace=RELEASE_NAMESPACE)
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


def test_chart_packages_with_crds_and_dashboard(tmp_path) -> None:
    archive = helm.package(CHART_DIR, destination=tmp_path)
    with helm.Chart.load(archive) as packaged:
        assert {c["name"] for c in packaged.crds} == {c["name"] for c in chart().crds}
        names = {f["name"] for f in packaged.files}
        assert "dashboards/stream-replicator.json" in names


# --------------------------------------------------------------------------------------------------
# Rendering: every value set renders objects Kubernetes accepts


def check_custom_kind(obj: dict) -> None:
    """Shape checks for kinds without a built-in schema."""
    if obj["kind"] == "ServiceMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        spec = obj["spec"]
        assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
        assert spec["selector"]["matchLabels"] and all(
            isinstance(v, str) for v in spec["selector"]["matchLabels"].values()
        )
        ns = spec["namespaceSelector"]
        assert ns == {"any": True} or (set(ns) == {"matchNames"} and ns["matchNames"])
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
            assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")
            for key in ("interval", "scrapeTimeout"):
                if key in endpoint:
                    assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint[key])
    elif obj["kind"] == "PrometheusRule":  # the rules themselves: tests/helm/test_alerts.py (promtool)
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(obj["spec"]) == {"groups"}
        for group in obj["spec"]["groups"]:
            assert set(group) == {"name", "rules"} and group["rules"]
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
                assert isinstance(rule["expr"], str) and rule["labels"]["severity"] in ("warning", "critical")
                if "for" in rule:
                    assert re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", rule["for"])
                assert all(isinstance(v, str) for v in (*rule["labels"].values(), *rule["annotations"].values()))
    else:  # kopf peering objects: metadata only, kopf fills the status
        assert obj["apiVersion"] == "kopf.dev/v1"
        assert set(obj) == {"apiVersion", "kind", "metadata"}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_renders_valid_kubernetes_objects(name: str) -> None:
    objects = render(VALUE_SETS[name])
    assert objects
    kinds = {o["kind"] for o in objects}
    assert "Deployment" in kinds
    for obj in objects:
        meta = obj["metadata"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/name"] == "stream-replicator"
        assert "app.kubernetes.io/component" in labels and "helm.sh/chart" in labels
        assert len(meta["name"]) <= 63
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta
        else:
            assert meta["namespace"], f"{obj['kind']}/{meta['name']} has no namespace"
        if obj["kind"] in CUSTOM_KINDS:
            check_custom_kind(obj)
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_chart_crds_are_valid_definitions() -> None:
    docs = crds()
    assert {d["spec"]["names"]["kind"] for d in docs} >= {"KopfPeering", "ClusterKopfPeering"}
    for doc in docs:
        assert doc["kind"] == "CustomResourceDefinition"
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_streamreplication_crd_is_the_repository_file() -> None:
    """The chart ships crds/streamreplications.streamreplicator.io.yaml byte for byte."""
    name = "streamreplications.streamreplicator.io.yaml"
    source = REPO / "crds" / name
    shipped = CHART_DIR / "crds" / name
    assert source.is_file(), f"{source} is missing"
    assert shipped.is_file(), f"copy {source.relative_to(REPO)} to {shipped.relative_to(REPO)}"
    assert shipped.read_bytes() == source.read_bytes(), (
        f"{shipped.relative_to(REPO)} differs from {source.relative_to(REPO)}"
    )
    crd = yaml.safe_load(shipped.read_text())
    assert crd["metadata"]["name"] == "streamreplications.streamreplicator.io"
    assert any(c["name"].endswith(name) for c in chart().crds)


# --------------------------------------------------------------------------------------------------
# The operator Deployment


def test_operator_deployment_defaults() -> None:
    dep = deployment()
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == f"{RELEASE}-stream-replicator"
    c = container()
    assert c["image"] == f"ghcr.io/stream-replicator/stream-replicator:{chart().metadata['appVersion']}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["stream-replicator-operator"]
    assert c["args"] == [
        "--all-namespaces",
        f"--peering={RELEASE}-stream-replicator",
        "--metrics-port=8081",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    assert env(c)["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Selector labels must stay stable across upgrades: no version in them.
    assert set(spec["selector"]["matchLabels"]) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
    }
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_security_context_is_locked_down() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (Dockerfile)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container()["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still gets a scratch /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container()["volumeMounts"]
    assert container()["resources"]["requests"] and container()["resources"]["limits"]["memory"]


@pytest.mark.parametrize(
    ("values", "scope_args", "peering_arg"),
    [
        ({}, ["--all-namespaces"], f"--peering={RELEASE}-stream-replicator"),
        ({"operator": {"namespaces": ["a", "b"]}}, ["--namespace=a", "--namespace=b"], None),
        ({"rbac": {"namespaced": True}}, [f"--namespace={RELEASE_NAMESPACE}"], None),
        ({"peering": {"enabled": False}}, ["--all-namespaces"], "--standalone"),
        ({"peering": {"name": "fleet"}}, ["--all-namespaces"], "--peering=fleet"),
    ],
)
def test_operator_arguments(values: dict, scope_args: list[str], peering_arg: str | None) -> None:
    args = container(values)["args"]
    assert args[: len(scope_args)] == scope_args
    assert (peering_arg or f"--peering={RELEASE}-stream-replicator") == args[len(scope_args)]
    assert args[-1] == "--liveness=http://0.0.0.0:8080/healthz"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_operator_command_line_accepts_the_rendered_arguments(name: str) -> None:
    """The real `stream-replicator-operator` argument parser reads what the chart passes."""
    from replication_operator.main import build_parser, check_arguments

    values = VALUE_SETS[name]
    c = container(values)
    assert c["command"] == ["stream-replicator-operator"]
    args = build_parser().parse_args(c["args"])
    namespaces = list(values.get("operator", {}).get("namespaces", []))
    if not namespaces and values.get("rbac", {}).get("namespaced"):
        namespaces = [RELEASE_NAMESPACE]
    assert args.all_namespaces is (not namespaces)
    assert (args.namespaces or []) == namespaces
    peering = values.get("peering", {})
    assert args.standalone is (peering.get("enabled") is False)
    if not args.standalone:
        assert args.peering == (peering.get("name") or f"{RELEASE}-stream-replicator")
    port = values.get("operator", {}).get("healthPort", 8080)
    assert args.liveness == f"http://0.0.0.0:{port}/healthz"
    assert args.metrics_port == values.get("operator", {}).get("metricsPort", 8081)
    assert args.roles_only is bool(values.get("rbac", {}).get("rolesOnly"))
    assert check_arguments(args) is None


def test_custom_image_and_scheduling() -> None:
    values = copy.deepcopy(VALUE_SETS["custom-image"])
    values.update(VALUE_SETS["scheduling-and-extras"])
    dep = deployment(values)
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com/team/sr:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    variables = env(c)
    assert variables["STREAM_REPLICATOR_WORKER_IMAGE"] == "registry.example.com/team/sr-worker:1.2.3"
    assert variables["STREAM_REPLICATOR_SPARK_IMAGE"] == "registry.example.com/team/sr:spark-7"
    assert variables["TZ"] == "UTC"
    assert dep["metadata"]["labels"]["app.kubernetes.io/version"] == "1.2.3"
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == values[key]
    assert dep["spec"]["template"]["metadata"]["annotations"] == values["podAnnotations"]
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "nats"
    assert c["resources"] == values["resources"]
    assert c["args"][-2:] == ["--liveness=http://0.0.0.0:9090/healthz", "--verbose"]
    assert c["ports"][0]["containerPort"] == 9090


def test_default_worker_and_spark_images_follow_the_operator_image() -> None:
    """The chart's defaults are the operator's own defaults, which `make image` tags."""
    c = container()
    variables = env(c)
    version = chart().metadata["appVersion"]
    assert c["image"] == images.DEFAULT_WORKER_IMAGE == f"ghcr.io/stream-replicator/stream-replicator:{version}"
    assert variables[images.WORKER_IMAGE_ENV] == images.DEFAULT_WORKER_IMAGE
    assert variables[images.SPARK_IMAGE_ENV] == images.DEFAULT_SPARK_IMAGE


# --------------------------------------------------------------------------------------------------
# RBAC: exactly the calls the operator makes, least privilege


def granted(objects: list[dict]) -> tuple[dict, dict[str, dict]]:
    """(cluster-wide permissions, {namespace: permissions}) of the operator's ServiceAccount."""
    sa = f"{RELEASE}-stream-replicator"
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NAMESPACE}
    cluster: dict = {}
    for binding in find(objects, "ClusterRoleBinding"):
        assert binding["subjects"] == [subject]
        role = one(
            [o for o in find(objects, "ClusterRole") if o["metadata"]["name"] == binding["roleRef"]["name"]],
            "ClusterRole",
        )
        cluster.update(permissions(role["rules"]))
    by_namespace: dict[str, dict] = {}
    for binding in find(objects, "RoleBinding"):
        assert binding["subjects"] == [subject]
        assert binding["roleRef"]["kind"] == "Role"
        ns = binding["metadata"]["namespace"]
        roles = [o for o in find(objects, "Role") if o["metadata"]["namespace"] == ns]
        assert [r["metadata"]["name"] for r in roles] == [binding["roleRef"]["name"]]
        by_namespace[ns] = permissions(roles[0]["rules"])
    return cluster, by_namespace


def test_cluster_rbac_grants_exactly_the_operator_calls() -> None:
    objects = render()
    cluster, by_namespace = granted(objects)
    expected_cluster, expected_namespaced = expected_rbac(clusterwide=True)
    assert cluster == {**expected_cluster, **expected_namespaced}
    assert by_namespace == {}
    assert find(objects, "Role") == []


def test_namespaced_rbac_grants_roles_per_namespace() -> None:
    objects = render(VALUE_SETS["namespaced-rbac"])
    cluster, by_namespace = granted(objects)
    expected_cluster, expected_namespaced = expected_rbac(clusterwide=False)
    assert cluster == expected_cluster  # cluster-scoped reads only
    assert by_namespace == {"team-a": expected_namespaced, "team-b": expected_namespaced}


def test_namespaced_rbac_defaults_to_the_release_namespace() -> None:
    _, by_namespace = granted(render(VALUE_SETS["namespaced-rbac-release-namespace"]))
    assert by_namespace == {RELEASE_NAMESPACE: expected_rbac(clusterwide=False)[1]}


def test_cluster_rbac_with_listed_namespaces_uses_namespaced_peering() -> None:
    cluster, _ = granted(render(VALUE_SETS["cluster-rbac-some-namespaces"]))
    expected_cluster, expected_namespaced = expected_rbac(clusterwide=False)
    assert cluster == {**expected_cluster, **expected_namespaced}


def test_standalone_needs_no_peering_rights() -> None:
    for values in (
        {"peering": {"enabled": False}},
        {"peering": {"enabled": False}, "rbac": {"namespaced": True}},
    ):
        objects = render(values)
        cluster, by_namespace = granted(objects)
        assert not any(group == "kopf.dev" for group, _ in cluster)
        assert not any(group == "kopf.dev" for perms in by_namespace.values() for group, _ in perms)
        assert find(objects, "KopfPeering") == find(objects, "ClusterKopfPeering") == []


def test_rbac_and_service_account_can_be_external() -> None:
    objects = render(VALUE_SETS["existing-service-account-no-rbac"])
    assert {o["kind"] for o in objects}.isdisjoint(
        {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    )
    assert (
        deployment(VALUE_SETS["existing-service-account-no-rbac"])["spec"]["template"]["spec"][
            "serviceAccountName"
        ]
        == "custom-sa"
    )


def test_roles_only_grants_no_cluster_role() -> None:
    """rbac.rolesOnly: the operator runs --roles-only and holds Roles in its namespaces, nothing else."""
    objects = render(VALUE_SETS["roles-only"])
    cluster, by_namespace = granted(objects)
    assert cluster == {}
    assert operator_roles(objects, "ClusterRole") == find(objects, "ClusterRoleBinding") == []
    assert by_namespace == {"team-a": expected_rbac(clusterwide=False, roles_only=True)[1]}
    assert "--roles-only" in container(VALUE_SETS["roles-only"])["args"]


AGGREGATED = ("view", "edit", "admin")
USER_READ = frozenset({"get", "list", "watch"})


def aggregated(objects: list[dict], role: str) -> dict:
    """What Kubernetes' aggregation controller adds to the built-in `role` from the chart's ClusterRoles."""
    label = f"rbac.authorization.k8s.io/aggregate-to-{role}"
    chosen = [o for o in find(objects, "ClusterRole") if o["metadata"]["labels"].get(label) == "true"]
    return permissions([rule for role_object in chosen for rule in role_object["rules"]])


@pytest.mark.parametrize("name", ["defaults", "namespaced-rbac", "roles-only"])
def test_user_roles_aggregate_to_view_edit_and_admin(name: str) -> None:
    objects = render(VALUE_SETS[name])
    group = "streamreplicator.io"
    view = {(group, "streamreplications"): USER_READ, (group, "streamreplications/status"): USER_READ,
            (group, "streamreplications/scale"): USER_READ, (group, "natsconnections"): USER_READ,
            (group, "natsconnections/status"): USER_READ}
    edit = {
        (group, "streamreplications"): USER_READ | {"create", "update", "patch", "delete", "deletecollection"},
        (group, "streamreplications/status"): USER_READ,  # only the operator writes the status
        (group, "streamreplications/scale"): USER_READ | {"update", "patch"},  # kubectl scale
        (group, "natsconnections"): USER_READ | {"create", "update", "patch", "delete", "deletecollection"},
        (group, "natsconnections/status"): USER_READ,
    }
    assert {role: aggregated(objects, role) for role in AGGREGATED} == {"view": view, "edit": edit, "admin": edit}
    user_roles = [o for o in find(objects, "ClusterRole") if o not in operator_roles(objects, "ClusterRole")]
    assert sorted(o["metadata"]["name"] for o in user_roles) == [f"{RELEASE}-stream-replicator-edit",
                                                                 f"{RELEASE}-stream-replicator-view"]
    for role in user_roles:  # never bound by the chart; validated like every rendered object
        assert not any(b["roleRef"]["name"] == role["metadata"]["name"]
                       for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"))
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(role, version, strict=True)
    # The operator's own roles never aggregate into anyone's.
    for role in operator_roles(objects, "ClusterRole") + operator_roles(objects, "Role"):
        assert not any(k.startswith("rbac.authorization.k8s.io/aggregate") for k in role["metadata"]["labels"])


def test_user_roles_can_be_left_out() -> None:
    objects = render(VALUE_SETS["no-aggregated-roles"])
    assert all(aggregated(objects, role) == {} for role in AGGREGATED)
    assert granted(objects) == granted(render())


# --------------------------------------------------------------------------------------------------
# The tenancy policy


def test_policy_values_reach_the_operator() -> None:
    """The chart's policy values become the operator's policy (through its environment); the chart's
    defaults are the operator's own."""
    from replication_operator.checks.policy import Policy
    from replication_operator.settings import OperatorConfig

    def variables(values: dict[str, Any]) -> dict[str, str]:
        return {e["name"]: e["value"] for e in container(values)["env"] if "value" in e}

    def policy_of(values: dict[str, Any]) -> Policy:
        return OperatorConfig.from_env(variables(values)).make_policy()

    own = tuple(variables({})[f"STREAM_REPLICATOR_{kind}_IMAGE"] for kind in ("WORKER", "SPARK"))
    chosen = VALUE_SETS["policy"]["policy"]
    assert policy_of(VALUE_SETS["policy"]) == Policy(
        own_images=own,
        own_service_accounts=("spark-operator-spark",),
        images=tuple(chosen["allowedImages"]),
        service_accounts=tuple(chosen["allowedServiceAccounts"]),
        unlabelled_secrets_namespaces=tuple(chosen["unlabelledSecretsNamespaces"]),
        nats_hosts=tuple(chosen["allowedNatsHosts"]),
        spark_conf=tuple(chosen["allowedSparkConf"]),
        spark_packages=tuple(chosen["allowedSparkPackages"]),
    )
    operator_defaults = dataclasses.replace(OperatorConfig().make_policy(), own_images=own)
    assert policy_of({}) == operator_defaults


def test_rbac_rules_live_in_one_helper() -> None:
    """Templates take rules only from templates/_rbac.tpl (the list tests and operator checks read)."""
    for path in (CHART_DIR / "templates").iterdir():
        text = path.read_text()
        if path.name == "_rbac.tpl":
            assert 'define "stream-replicator.rbacRules"' in text
        else:
            assert "apiGroups" not in text, f"{path.name} defines RBAC rules outside _rbac.tpl"


# --------------------------------------------------------------------------------------------------
# Peering objects


def test_peering_objects_match_the_operator_scope() -> None:
    cluster_peering = one(render(), "ClusterKopfPeering")
    assert cluster_peering["metadata"]["name"] == f"{RELEASE}-stream-replicator"
    assert find(render(), "KopfPeering") == []
    namespaced = find(render(VALUE_SETS["namespaced-rbac"]), "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in namespaced) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in namespaced} == {f"{RELEASE}-stream-replicator"}


# --------------------------------------------------------------------------------------------------
# Optional objects


def test_optional_objects_are_off_by_default() -> None:
    kinds = {o["kind"] for o in render()}
    assert "ServiceMonitor" not in kinds and "PodDisruptionBudget" not in kinds
    assert "PrometheusRule" not in kinds and "Service" not in kinds
    assert "ConfigMap" in kinds  # the dashboard


def workers_monitor(values: dict[str, Any]) -> dict:
    (sm,) = find(render(values), "ServiceMonitor", f"{RELEASE}-stream-replicator-workers")
    return sm


def test_service_monitor() -> None:
    sm = workers_monitor(VALUE_SETS["service-monitor"])
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["namespaceSelector"] == {"any": True}
    assert sm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "stream-replicator",
        "app.kubernetes.io/component": "metrics",
    }
    assert sm["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    sm = workers_monitor(VALUE_SETS["service-monitor-namespaced"])
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}


def test_operator_metrics_are_scraped_with_the_workers() -> None:
    """The operator's /metrics: a port on its container, a Service selecting its pod, and a
    ServiceMonitor that keeps the metrics' own `namespace` label."""
    objects = render(VALUE_SETS["service-monitor"])
    c = container(VALUE_SETS["service-monitor"])
    assert "--metrics-port=8081" in c["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in c["ports"]
    assert env(c)["STREAM_REPLICATOR_CERTIFICATE_WARNING"] == "14d"
    service = one(objects, "Service")
    pod_labels = deployment(VALUE_SETS["service-monitor"])["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    monitors = {m["metadata"]["name"]: m for m in find(objects, "ServiceMonitor")}
    operator = monitors[f"{RELEASE}-stream-replicator-operator"]
    assert operator["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert operator["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert operator["spec"]["endpoints"][0]["honorLabels"] is True
    workers = monitors[f"{RELEASE}-stream-replicator-workers"]
    assert not workers["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    values = {"metrics": {"serviceMonitor": {"enabled": True, "operator": False}}}
    assert [m["metadata"]["name"] for m in find(render(values), "ServiceMonitor")] == [
        f"{RELEASE}-stream-replicator-workers"]


def test_pod_disruption_budget() -> None:
    pdb = one(render(VALUE_SETS["pdb"]), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 0
    assert pdb["spec"]["selector"]["matchLabels"] == deployment()["spec"]["selector"]["matchLabels"]
    pdb = one(render(VALUE_SETS["pdb-min-available"]), "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": "50%", "selector": pdb["spec"]["selector"]}


def test_dashboard_configmap() -> None:
    cm = one(render(), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == RELEASE_NAMESPACE
    shipped = (CHART_DIR / "dashboards" / "stream-replicator.json").read_text()
    assert json.loads(cm["data"]["stream-replicator.json"]) == json.loads(shipped)
    assert cm["data"]["stream-replicator.json"] == shipped.rstrip("\n")
    cm = one(render(VALUE_SETS["dashboards-elsewhere"]), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "stream"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "NATS"}
    assert find(render(VALUE_SETS["dashboards-off"]), "ConfigMap") == []


def test_notes_render() -> None:
    notes = render_files()["stream-replicator/templates/NOTES.txt"]
    assert "all namespaces" in notes and "ClusterKopfPeering" in notes
    # The example StreamReplication in the notes is valid for the shipped CRD.
    example = textwrap.dedent(notes.split("<<'YAML'", 1)[1].split("\n", 1)[1].split("YAML\n", 1)[0])
    resource = yaml.safe_load(example)
    (crd,) = [c for c in crds() if c["spec"]["names"]["kind"] == resource["kind"]]
    (version,) = [
        v for v in crd["spec"]["versions"] if resource["apiVersion"] == f"{crd['spec']['group']}/{v['name']}"
    ]
    jsonschema.validate(resource, version["schema"]["openAPIV3Schema"])
    notes = render_files(VALUE_SETS["namespaced-rbac"])["stream-replicator/templates/NOTES.txt"]
    assert "team-a, team-b" in notes and "KopfPeering" in notes


def test_every_value_is_documented() -> None:
    """The Helm page of the manual names every key of values.yaml (pass-through maps as a whole)."""
    manual = (REPO / "docs" / "helm.md").read_text()
    whole = {"podSecurityContext", "securityContext", "resources", "metrics.serviceMonitor.selector"}

    def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
        keys = []
        for key, value in values.items():
            path = prefix + key
            if isinstance(value, dict) and value and path not in whole:
                keys.extend(leaves(value, path + "."))
            else:
                keys.append(path)
        return keys

    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    missing = [key for key in leaves(defaults) if f"`{key}`" not in manual]
    assert missing == []


# --------------------------------------------------------------------------------------------------
# values.schema.json rejects wrong values

BAD_VALUES: dict[str, dict[str, Any]] = {
    "unknown top-level key": {"replicaCount": 2},
    "typo in a section": {"rbac": {"namespace": True}},
    "pull policy not an enum value": {"image": {"pullPolicy": "Sometimes"}},
    "empty repository": {"image": {"repository": ""}},
    "tag not a string": {"image": {"tag": 1.2}},
    "namespaced not a boolean": {"rbac": {"namespaced": "yes"}},
    "namespace glob": {"operator": {"namespaces": ["team-*"]}},
    "namespaces not a list": {"operator": {"namespaces": "team-a"}},
    "duplicate namespaces": {"operator": {"namespaces": ["a", "a"]}},
    "health port privileged": {"operator": {"healthPort": 80}},
    "health port a string": {"operator": {"healthPort": "8080"}},
    "extra args not strings": {"operator": {"extraArgs": [1]}},
    "extra env without name": {"operator": {"extraEnv": [{"value": "x"}]}},
    "peering not a boolean": {"peering": {"enabled": "true"}},
    "peering name invalid": {"peering": {"name": "Fleet_1"}},
    "service monitor interval": {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
    "service monitor selector not strings": {"metrics": {"serviceMonitor": {"selector": {"tier": 1}}}},
    "service monitor path": {"metrics": {"serviceMonitor": {"path": "metrics"}}},
    "rule duration": {"metrics": {"prometheusRule": {"stuckFor": "ten minutes"}}},
    "rule days not a number": {"metrics": {"prometheusRule": {"certificateExpiryDays": "14"}}},
    "rule intervals zero": {"metrics": {"prometheusRule": {"fleetHealthIntervals": 0}}},
    "rule typo": {"metrics": {"prometheusRule": {"enable": True}}},
    "certificate warning": {"operator": {"certificateWarning": "two weeks"}},
    "metrics port privileged": {"operator": {"metricsPort": 81}},
    "pdb negative": {"podDisruptionBudget": {"maxUnavailable": -1}},
    "pdb bad percentage": {"podDisruptionBudget": {"minAvailable": "half"}},
    "dashboard label value not a string": {"dashboards": {"labelValue": 1}},
    "dashboards enabled a string": {"dashboards": {"enabled": "no"}},
    "pod annotation not a string": {"podAnnotations": {"a": 1}},
    "tolerations not a list": {"tolerations": {"key": "x"}},
    "nodeSelector value not a string": {"nodeSelector": {"zone": 1}},
    "resources typo": {"resources": {"limit": {"cpu": 1}}},
    "pull secret without name": {"imagePullSecrets": [{"secret": "x"}]},
    "fullname override invalid": {"fullnameOverride": "Stream_Replicator"},
    "service account create a string": {"serviceAccount": {"create": "false"}},
    "roles only without namespaced rbac": {"rbac": {"rolesOnly": True}},
    "aggregation not a boolean": {"rbac": {"aggregateToDefaultRoles": "yes"}},
    "policy typo": {"policy": {"allowedImage": ["x/*"]}},
    "policy pattern with a comma": {"policy": {"allowedImages": ["a/*,b/*"]}},
    "policy pattern empty": {"policy": {"allowedServiceAccounts": [""]}},
    "no NATS host at all": {"policy": {"allowedNatsHosts": []}},
    "policy not a list": {"policy": {"unlabelledSecretsNamespaces": "team-*"}},
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_rejects_bad_values(case: str) -> None:
    values = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError):
        chart().validate_schema(chart().merge_values(values))
    with pytest.raises(helm.HelmValuesError):
        render(values)
    report = helm.lint(CHART_DIR, values, namespace=RELEASE_NAMESPACE)
    assert report["errors"], f"lint accepted {values}"


def test_default_values_satisfy_the_schema() -> None:
    chart().validate_schema(chart().values)
    for values in VALUE_SETS.values():
        chart().validate_schema(chart().merge_values(values))
