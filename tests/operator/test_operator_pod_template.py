"""Pod templates (`spec.template`, `spec.fleetHealth.template`): the built worker Deployment, PDB and
Spark application carry them and stay valid for Kubernetes and the Spark operator; the tenancy policy
refuses what widens a pod; and the real operator process builds them against the API emulator."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from replication_operator.build import workload
from replication_operator.build.children import BuildOptions, build_children
from replication_operator.checks import policy
from replication_operator.checks.secrets import secret_needs
from replication_operator.model import naming
from replication_operator.model.spec import SpecError, parse_spec
from replication_operator.settings import OperatorConfig

from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_builders import _validate
from tests.operator.test_operator_main import SCRIPT, _kubeconfig, _start
from tests.support.kube_emulator import ClusterEmulator, wait_for

NS = "replication"
SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
          "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "telemetry-region"}}}
# OpenShift restricted-v2: the platform assigns the UID and fsGroup; the pod only insists on non-root.
RESTRICTED_V2 = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
TEMPLATE: dict[str, Any] = {
    "pod": {
        "metadata": {"labels": {"team": "payments", "app.kubernetes.io/instance": "stolen"},
                     "annotations": {"cost-centre": "42"}},
        "imagePullSecrets": [{"name": "registry-pull"}],
        "priorityClassName": "replication-high",
        "topologySpreadConstraints": [SPREAD],
        "securityContext": RESTRICTED_V2,
        "nodeSelector": {"pool": "replication"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "nats", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": {"team": "payments"}}}}]}},
        "terminationGracePeriodSeconds": 60,
    },
    "container": {
        "env": [{"name": "TZ", "value": "UTC"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "SR_INSTANCE", "value": "hijacked"},
                {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "extra", "key": "api-key"}}}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    },
    "podDisruptionBudget": {"minAvailable": "50%"},
}


def _resource(example: str = "telemetry-region", **template: Any) -> dict[str, Any]:
    resource = h.example(example, NS)
    resource["spec"]["template"] = template or TEMPLATE
    return resource


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"])


def test_the_template_reaches_a_valid_deployment_and_pdb() -> None:
    resource = _resource()
    resource["spec"]["replicas"] = 3
    assert h.cr_errors(resource) == []
    children = build_children(parse_spec(resource))
    deployment = h.child_of(children, naming.DEPLOYMENT)
    pdb = h.child_of(children, naming.PDB)
    assert deployment is not None and pdb is not None
    _validate(deployment)
    _validate(pdb)
    template = _pod(deployment)
    pod = template["spec"]
    (container,) = pod["containers"]
    # The operator's labels select the pods: a template cannot take them over.
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "telemetry-region"
    assert template["metadata"]["labels"]["team"] == "payments"
    assert template["metadata"]["annotations"]["cost-centre"] == "42"
    assert pod["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert pod["priorityClassName"] == "replication-high"
    assert pod["topologySpreadConstraints"] == [SPREAD]
    assert pod["securityContext"] == RESTRICTED_V2  # no runAsUser, runAsGroup or fsGroup: the platform's
    assert pod["nodeSelector"]["pool"] == "replication"  # added to spec.nodeSelector
    assert pod["tolerations"][-1]["key"] == "dedicated"
    assert pod["affinity"] == TEMPLATE["pod"]["affinity"]
    assert pod["terminationGracePeriodSeconds"] == 60
    env = {e["name"]: e for e in container["env"]}
    assert env["TZ"]["value"] == "UTC" and env["NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "valueFrom" in env["SR_INSTANCE"] and "value" not in env["SR_INSTANCE"]  # the operator's own wins
    assert container["resources"] == TEMPLATE["container"]["resources"]
    assert "runAsUser" not in container["securityContext"]
    assert pdb["spec"] == {"minAvailable": "50%", "selector": pdb["spec"]["selector"]}


def test_without_a_template_the_pods_are_as_before() -> None:
    children = build_children(parse_spec(h.example("telemetry-region", NS)))
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    pod = _pod(deployment)["spec"]
    assert pod["securityContext"] == workload.POD_SECURITY
    assert pod["containers"][0]["securityContext"] == workload.CONTAINER_SECURITY
    assert "imagePullSecrets" not in pod and "priorityClassName" not in pod


@pytest.mark.parametrize("budget", [{"maxUnavailable": 2}, {"maxUnavailable": "25%"}, {"minAvailable": 1}])
def test_the_pdb_is_tunable(budget: dict[str, Any]) -> None:
    resource = _resource(podDisruptionBudget=budget)
    resource["spec"]["replicas"] = 4
    pdb = h.child_of(build_children(parse_spec(resource)), naming.PDB)
    assert pdb is not None
    _validate(pdb)
    assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == budget


def test_the_pdb_takes_one_limit() -> None:
    resource = _resource(podDisruptionBudget={"maxUnavailable": 1, "minAvailable": 1})
    assert any("maxUnavailable or minAvailable" in e for e in h.cr_errors(resource))
    with pytest.raises(SpecError, match="maxUnavailable or minAvailable"):
        parse_spec(resource)


def test_fields_that_would_widen_more_are_not_offered() -> None:
    """hostNetwork, volumes, sysctls: the CRD has no place for them, so the API server prunes them."""
    pod = h.schema()["properties"]["spec"]["properties"]["template"]["properties"]["pod"]["properties"]
    assert not {"hostNetwork", "hostPID", "hostIPC", "volumes", "hostAliases", "initContainers"} & set(pod)
    assert not {"sysctls", "seLinuxOptions", "windowsOptions"} & set(pod["securityContext"]["properties"])


def test_the_spark_pods_take_the_fleet_health_template() -> None:
    resource = h.example("registrations-region", NS)
    resource["spec"]["fleetHealth"]["template"] = {k: v for k, v in TEMPLATE.items() if k != "podDisruptionBudget"}
    resource["spec"]["fleetHealth"]["template"]["container"] = {
        k: v for k, v in TEMPLATE["container"].items() if k != "resources"}
    assert h.cr_errors(resource) == []
    children = build_children(parse_spec(resource), BuildOptions(spark_image="stream-replicator:0.1.0-spark"))
    app = h.child_of(children, naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    _validate(app)
    template = app["spec"]["template"]
    assert template["imagePullSecrets"] == ["registry-pull"]
    for role in ("driver", "executor"):
        pod = template[role]
        assert pod["labels"]["team"] == "payments"
        assert pod["labels"]["app.kubernetes.io/instance"] == "registrations-region"
        assert pod["annotations"] == {"cost-centre": "42"}
        assert pod["priorityClassName"] == "replication-high"
        assert pod["podSecurityContext"] == RESTRICTED_V2
        assert "runAsUser" not in pod["securityContext"]
        assert pod["template"]["spec"]["topologySpreadConstraints"] == [SPREAD]
        assert pod["nodeSelector"] == {"pool": "replication"}
        assert {e["name"] for e in pod["env"]} >= {"TZ", "NODE", "API_KEY"}


def test_secrets_a_template_names_go_through_the_label_rule() -> None:
    needs = {(n.secret, n.key) for n in secret_needs(parse_spec(_resource())) if n.side == "template"}
    assert needs == {("registry-pull", ".dockerconfigjson"), ("extra", "api-key")}


DEFAULT = OperatorConfig().make_policy()
PRIVILEGED = OperatorConfig(privileged_pods_namespaces=(NS,)).make_policy()


@pytest.mark.parametrize(
    ("template", "rules", "reasons"),
    [
        (TEMPLATE, DEFAULT, []),
        ({"pod": {"securityContext": {"runAsUser": 0}}}, DEFAULT, [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"pod": {"securityContext": {"runAsNonRoot": False}}}, DEFAULT, [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"pod": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}, DEFAULT,
         [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"container": {"securityContext": {"privileged": True}}}, DEFAULT, [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"container": {"securityContext": {"allowPrivilegeEscalation": True}}}, DEFAULT,
         [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"container": {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}}, DEFAULT,
         [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"container": {"securityContext": {"runAsUser": 0, "privileged": True}}}, DEFAULT,
         [policy.POD_SECURITY_NOT_ALLOWED] * 2),
        ({"pod": {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/worker":
                                               "unconfined"}}}}, DEFAULT, [policy.POD_SECURITY_NOT_ALLOWED]),
        ({"container": {"securityContext": {"runAsUser": 0, "privileged": True}}}, PRIVILEGED, []),
        ({"pod": {"priorityClassName": "system-cluster-critical"}}, DEFAULT, [policy.PRIORITY_CLASS_NOT_ALLOWED]),
        ({"pod": {"priorityClassName": "system-cluster-critical"}},
         OperatorConfig(allowed_priority_classes=("system-cluster-critical",)).make_policy(), []),
        ({"pod": {"priorityClassName": "batch-low"}},
         OperatorConfig(allowed_priority_classes=("replication-*",)).make_policy(),
         [policy.PRIORITY_CLASS_NOT_ALLOWED]),
    ],
)
def test_policy(template: dict[str, Any], rules: policy.Policy, reasons: list[str]) -> None:
    resource = _resource(**template)
    resource["spec"].pop("image", None)  # the example's own image is another rule's business
    spec = parse_spec(resource)
    assert [v.reason for v in policy.check(spec, rules)] == reasons


def test_policy_covers_the_spark_template_and_names_the_field_and_flag() -> None:
    resource = h.example("registrations-region", NS)
    resource["spec"]["fleetHealth"]["template"] = {"container": {"securityContext": {"privileged": True}}}
    (violation,) = policy.check(parse_spec(resource), DEFAULT)
    assert "spec.fleetHealth.template.container.securityContext.privileged" in violation.message
    assert "--allow-privileged-pods" in violation.message


async def test_the_operator_process_builds_the_templated_deployment(tmp_path: Path) -> None:
    """The console script, as deployed, against the API emulator: the Deployment it writes carries the
    template, and a refused template builds nothing."""
    from kmock import Server

    async with ClusterEmulator() as cluster, Server(cluster):
        api = Api(cluster)
        for name, key in (("registry-pull", ".dockerconfigjson"), ("extra", "api-key")):
            await api.create(h.fake_secret(name, NS, {key: b"{}"}))
        env = dict(os.environ, KUBECONFIG=str(_kubeconfig(tmp_path / "kubeconfig", str(cluster.url))))
        log = tmp_path / "operator.log"
        proc = _start([SCRIPT, "--all-namespaces", "--standalone", "--liveness", "", "--metrics-port", "0"], env, log)
        try:
            resource = _resource()
            resource["spec"]["replicas"] = 2
            for key in ("uid", "generation"):
                resource["metadata"].pop(key, None)
            resource["spec"].pop("image", None)
            await api.create(resource)
            deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "telemetry-region"),
                                        within=30, interval=0.1)
            pod = _pod(deployment)["spec"]
            assert pod["securityContext"] == RESTRICTED_V2
            assert pod["imagePullSecrets"] == [{"name": "registry-pull"}]
            assert pod["topologySpreadConstraints"] == [SPREAD]
            assert pod["priorityClassName"] == "replication-high"
            pdb = await wait_for(lambda: api.get(naming.PDB, NS, naming.pdb_name("telemetry-region")), within=10)
            assert pdb["spec"]["minAvailable"] == "50%"

            refused = _resource(container={"securityContext": {"privileged": True}})
            refused["metadata"]["name"] = "telemetry-root"
            for key in ("uid", "generation"):
                refused["metadata"].pop(key, None)
            refused["spec"].pop("image", None)
            await api.create(refused)

            def reason() -> str | None:
                obj = api.get(naming.STREAM_REPLICATION, NS, "telemetry-root")
                conditions = ((obj or {}).get("status") or {}).get("conditions") or []
                found = [c.get("reason") for c in conditions if c.get("reason") == policy.POD_SECURITY_NOT_ALLOWED]
                return found[0] if found else None

            assert await wait_for(reason, within=20, interval=0.1) == policy.POD_SECURITY_NOT_ALLOWED
            assert api.get(naming.DEPLOYMENT, NS, "telemetry-root") is None
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
        assert code == 0, log.read_text()[-2000:]
