"""The tenancy policy: what a StreamReplication's author may choose, and what a refusal does.

The pure rules first (operator/checks/policy.py, the flags and environment that set them), then each rule
with the real operator against the API emulator: refused on create (condition, Event, nothing
built), built once the rule is loosened (a restart with new settings, or the Secret's owner
labelling it), and an edit the rule refuses leaving the running children exactly as they were.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from replication_operator import main as cli
from replication_operator.build import spark_application
from replication_operator.checks import policy
from replication_operator.checks.policy import Policy
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import OperatorConfig

from tests.operator import helpers as h
from tests.operator.conftest import FAST
from tests.operator.helpers import Api
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

NS = "replication"
SECRET_VALUE = b"-----BEGIN NATS USER JWT-----\nnever-shown\n------END NATS USER JWT------\n"


# ---- the rules, pure ----
def _spec(**changes: Any) -> Any:
    resource = h.example("registrations-region", NS)
    for path, value in changes.items():
        node = resource["spec"]
        *parents, last = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_spec(resource)


DEFAULT = OperatorConfig().make_policy()


@pytest.mark.parametrize(
    ("changes", "rules", "reasons"),
    [
        ({}, DEFAULT, []),
        # Images: the operator's own are always allowed, others only by pattern.
        ({"image": OperatorConfig().worker_image}, DEFAULT, []),
        ({"fleetHealth__image": spark_application.DEFAULT_IMAGE}, DEFAULT, []),
        ({"image": "docker.io/someone/miner:1"}, DEFAULT, [policy.IMAGE_NOT_ALLOWED]),
        ({"image": "registry.example.net/team/sr:2"}, Policy(images=("registry.example.net/*",)), []),
        ({"image": "registry.example.net.evil.io/sr:2"}, Policy(images=("registry.example.net/*",)),
         [policy.IMAGE_NOT_ALLOWED]),
        ({"fleetHealth__image": "evil/spark:1"}, DEFAULT, [policy.IMAGE_NOT_ALLOWED]),
        # Service accounts: none named is fine; names (or namespace/name) by pattern.
        ({"serviceAccountName": "admin"}, DEFAULT, [policy.SERVICE_ACCOUNT_NOT_ALLOWED]),
        ({"serviceAccountName": "sr-worker"}, Policy(service_accounts=("sr-*",)), []),
        ({"serviceAccountName": "sr-worker"}, Policy(service_accounts=("other/sr-*",)),
         [policy.SERVICE_ACCOUNT_NOT_ALLOWED]),
        ({"serviceAccountName": "sr-worker"}, Policy(service_accounts=(f"{NS}/sr-worker",)), []),
        ({"fleetHealth__serviceAccount": "spark-operator-spark"}, DEFAULT, []),
        ({"serviceAccountName": "spark-operator-spark"}, DEFAULT, [policy.SERVICE_ACCOUNT_NOT_ALLOWED]),
        ({"fleetHealth__serviceAccount": "cluster-admin-sa"}, DEFAULT, [policy.SERVICE_ACCOUNT_NOT_ALLOWED]),
        # NATS hosts: any by default; names by pattern, IP addresses also by CIDR.
        # (a user:password in the URL is the side's one way to sign in: no credentialsSecret with it)
        ({"source__url": "nats://u:pw@10.1.2.3:4222", "source__credentialsSecret": None}, DEFAULT, []),
        ({"source__url": "nats://u:pw@10.1.2.3:4222", "source__credentialsSecret": None},
         Policy(nats_hosts=("10.0.0.0/8", "*.example.net")), []),
        ({"source__url": "nats://a.nats.example.net,nats://10.9.9.9:4222",
          "target__url": "tls://B.NATS.example.net:4222"},
         Policy(nats_hosts=("*.nats.example.net", "10.0.0.0/8")), []),
        ({"source__url": "nats://169.254.169.254:4222"}, Policy(nats_hosts=("10.0.0.0/8", "*.example.net")),
         [policy.HOST_NOT_ALLOWED]),
        ({"fleetHealth__url": "nats://[::1]:4222"}, Policy(nats_hosts=("127.0.0.0/8", "*.example.net")),
         [policy.HOST_NOT_ALLOWED]),
        # Spark settings: the output's file system by default, never the pods' shape.
        ({"fleetHealth__sparkConf": {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000"}}, DEFAULT, []),
        ({"fleetHealth__sparkConf": {"spark.kubernetes.driver.container.image": "evil:1",
                                     "spark.driver.extraJavaOptions": "-XX:OnOutOfMemoryError=sh"}},
         DEFAULT, [policy.SPARK_CONF_NOT_ALLOWED, policy.SPARK_CONF_NOT_ALLOWED]),
    ],
)
def test_rules(changes: dict[str, Any], rules: Policy, reasons: list[str]) -> None:
    assert [v.reason for v in policy.check(_spec(**changes), rules)] == reasons


def test_messages_name_the_field_and_the_setting_but_no_credentials() -> None:
    spec = _spec(source__url="nats://user:hunter2@169.254.169.254:4222", source__credentialsSecret=None,
                 image="evil/x:1")
    messages = [v.message for v in policy.check(spec, Policy(nats_hosts=("*.example.net",)))]
    assert messages == [
        'spec.image "evil/x:1" is not an allowed image (allowed: none; set by --allow-image)',
        'spec.source.url: host "169.254.169.254" is not an allowed NATS host (allowed: *.example.net; '
        "set by --allow-nats-host)",
    ]


@pytest.mark.parametrize(
    ("namespace", "labels", "exempt", "usable"),
    [
        ("team-a", {policy.USABLE_LABEL: "true"}, (), True),
        ("team-a", {policy.USABLE_LABEL: "yes"}, (), False),
        ("team-a", {}, (), False),
        ("team-a", None, ("team-*",), True),
        ("prod", {}, ("team-*",), False),
    ],
)
def test_secret_label_rule(namespace: str, labels: dict[str, str] | None, exempt: tuple[str, ...],
                           usable: bool) -> None:
    rules = Policy(unlabelled_secrets_namespaces=exempt)
    assert policy.secret_usable(rules, namespace, labels) is usable
    violations = policy.secret_violations(rules, namespace, {"nats": labels})
    assert [v.reason for v in violations] == ([] if usable else [policy.SECRET_NOT_ALLOWED])


def test_settings_from_environment_and_flags() -> None:
    """Environment first, a flag replaces its variable; the defaults are the operator's own images."""
    env = {
        "STREAM_REPLICATOR_WORKER_IMAGE": "reg.example/sr:2",
        "STREAM_REPLICATOR_ALLOWED_IMAGES": "reg.example/*, other.example/sr:*",
        "STREAM_REPLICATOR_ALLOWED_NATS_HOSTS": "",
    }
    args = cli.build_parser().parse_args([
        "-n", "team-a", "--roles-only", "--allow-service-account", "sr-*,team-a/x",
        "--allow-spark-conf", "spark.sql.*", "--allow-spark-package", "org.example:*",
    ])
    assert cli.check_arguments(args) is None
    config = cli.operator_config(args, env)
    assert config.roles_only
    rules = config.make_policy()
    assert rules.own_images == ("reg.example/sr:2", spark_application.DEFAULT_IMAGE)
    assert rules.images == ("reg.example/*", "other.example/sr:*")
    assert rules.service_accounts == ("sr-*", "team-a/x")
    assert rules.nats_hosts == ()  # set to nothing: no host allowed
    assert rules.spark_conf == ("spark.sql.*",)
    assert rules.spark_packages == ("org.example:*",)
    assert rules.unlabelled_secrets_namespaces == ()
    default = cli.operator_config(cli.build_parser().parse_args(["-A"]), {}).make_policy()
    assert (default.images, default.service_accounts, default.nats_hosts, default.spark_conf) == (
        (), (), ("*",), ("spark.hadoop.*",))
    assert default.spark_packages == policy.DEFAULT_SPARK_PACKAGES
    for argv in (["-A", "--roles-only"], ["-n", "team-*", "--roles-only"]):
        assert "--roles-only" in str(cli.check_arguments(cli.build_parser().parse_args(argv)))


# ---- each rule with the real operator ----
def _status(api: Api, name: str) -> dict[str, Any]:
    return dict((api.get(naming.STREAM_REPLICATION, NS, name) or {}).get("status") or {})


def _condition(api: Api, name: str, kind: str) -> dict[str, Any]:
    return next((dict(c) for c in _status(api, name).get("conditions") or [] if c["type"] == kind), {})


def _children(api: Api, name: str) -> dict[str, dict[str, Any]]:
    """Every child that exists, by kind."""
    names = {
        naming.CONFIGMAP: naming.configmap_name(name),
        naming.SERVICE: naming.service_name(name),
        naming.DEPLOYMENT: naming.deployment_name(name),
        naming.PDB: naming.pdb_name(name),
        naming.SERVICE_MONITOR: naming.service_monitor_name(name),
        naming.SCHEDULED_SPARK_APPLICATION: naming.fleet_health_name(name),
    }
    found = {kind.kind: api.get(kind, NS, child) for kind, child in names.items()}
    return {kind: obj for kind, obj in found.items() if obj is not None}


def _pod(api: Api, name: str) -> dict[str, Any]:
    return dict((api.get(naming.DEPLOYMENT, NS, name) or {})["spec"]["template"]["spec"])


def _spark(api: Api, name: str) -> dict[str, Any]:
    return dict((api.get(naming.SCHEDULED_SPARK_APPLICATION, NS, naming.fleet_health_name(name)) or {})["spec"])


def _merged(base: Any, patch: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    return {**base, **{k: _merged(base.get(k), v) for k, v in patch.items()}}


@dataclasses.dataclass
class Rule:
    """One rule's story: a choice the starting policy refuses and the loosened one allows (`ask`),
    how it shows in the children (`shows`), and an edit the loosened policy still refuses."""

    reason: str
    example: str
    ask: dict[str, Any]
    shows: Callable[[Api, str], bool]
    still_refused: dict[str, Any]
    strict: OperatorConfig = FAST
    loose: OperatorConfig | None = None  # None: the Secret's owner labels it instead (no restart)


RULES = {
    "image": Rule(
        policy.IMAGE_NOT_ALLOWED, "cmdb-city1",
        ask={"image": "registry.example.net/sr:2"},
        shows=lambda api, n: _pod(api, n)["containers"][0]["image"] == "registry.example.net/sr:2",
        still_refused={"image": "docker.io/someone/miner:1"},
        loose=dataclasses.replace(FAST, allowed_images=("registry.example.net/*",)),
    ),
    "service-account": Rule(
        policy.SERVICE_ACCOUNT_NOT_ALLOWED, "cmdb-city1",
        ask={"serviceAccountName": "sr-worker"},
        shows=lambda api, n: _pod(api, n).get("serviceAccountName") == "sr-worker",
        still_refused={"serviceAccountName": "namespace-admin"},
        loose=dataclasses.replace(FAST, allowed_service_accounts=("sr-*",)),
    ),
    "secret": Rule(
        policy.SECRET_NOT_ALLOWED, "cmdb-city1",
        ask={"source": {"credentialsSecret": {"name": "unlabelled-nats", "key": "user.creds"}}},
        shows=lambda api, n: any(
            v.get("secret", {}).get("secretName") == "unlabelled-nats" for v in _pod(api, n)["volumes"]),
        still_refused={"source": {"credentialsSecret": {"name": "other-unlabelled", "key": "user.creds"}}},
    ),
    "host": Rule(
        policy.HOST_NOT_ALLOWED, "cmdb-city1",
        ask={"source": {"url": "nats://127.0.0.2:1"}},
        shows=lambda api, n: "nats://127.0.0.2:1" in str(api.get(naming.CONFIGMAP, NS, naming.configmap_name(n))),
        # IPv6 loopback: were the rule broken, the operator's status read would still stay on this host.
        still_refused={"source": {"url": "nats://[::1]:1"}},
        strict=dataclasses.replace(FAST, allowed_nats_hosts=("127.0.0.1",)),
        loose=dataclasses.replace(FAST, allowed_nats_hosts=("127.0.0.0/8",)),
    ),
    "spark-conf": Rule(
        policy.SPARK_CONF_NOT_ALLOWED, "registrations-region",
        ask={"fleetHealth": {"sparkConf": {"spark.sql.shuffle.partitions": "8"}}},
        # (beside what the operator adds itself, e.g. spark.jars.ivy for an s3a:// output's connector)
        shows=lambda api, n: (_spark(api, n)["template"].get("sparkConf") or {}).get(
            "spark.sql.shuffle.partitions") == "8",
        still_refused={"fleetHealth": {"sparkConf": {"spark.kubernetes.driver.container.image": "evil:1"}}},
        loose=dataclasses.replace(FAST, allowed_spark_conf=("spark.hadoop.*", "spark.sql.*")),
    ),
    "spark-package": Rule(
        policy.SPARK_PACKAGE_NOT_ALLOWED, "registrations-region",
        ask={"fleetHealth": {"packages": ["org.example:tools:1.0"]}},
        shows=lambda api, n: "org.example:tools:1.0" in (_spark(api, n)["template"].get("deps") or {}).get(
            "packages", []),
        still_refused={"fleetHealth": {"packages": ["org.apache.hadoop:hadoop-aws-evil:1"]}},
        loose=dataclasses.replace(FAST, allowed_spark_packages=(*policy.DEFAULT_SPARK_PACKAGES, "org.example:*")),
    ),
}
SECRETS = {"city1-nats": "user.creds", "region-eu-nats": "user.creds", "central-nats": "replicator.creds"}
ALWAYS = {"ConfigMap", "Service", "Deployment"}


def _resource(example: str, ask: dict[str, Any] | None = None) -> dict[str, Any]:
    resource = h.example(example, NS)
    for key in ("uid", "generation"):
        resource["metadata"].pop(key)
    resource["spec"]["source"]["url"] = resource["spec"]["target"]["url"] = "nats://127.0.0.1:1"
    resource["spec"] = _merged(resource["spec"], ask or {})
    return resource


async def _refused(api: Api, name: str, reason: str, generation: int) -> dict[str, Any]:
    """Waits for the refusal in status and as a Warning Event; returns the Degraded condition."""
    await wait_for(lambda: _condition(api, name, "Degraded").get("reason") == reason
                   and _status(api, name).get("observedGeneration") == generation)
    await wait_for(lambda: any(e["reason"] == reason and e["type"] == "Warning" for e in api.events(NS, name)))
    assert _condition(api, name, "Degraded")["status"] == "True"
    assert _condition(api, name, "Progressing")["reason"] == "Blocked"
    assert _condition(api, name, "Ready")["reason"] == reason
    return _condition(api, name, "Degraded")


async def _healthy_pods(api: Api, name: str) -> int:
    """The Deployment controller's part: every pod of the Deployment ready. Returns their number."""
    deployment = api.get(naming.DEPLOYMENT, NS, name) or {}
    pods = deployment["spec"]["replicas"]
    await api.patch(naming.DEPLOYMENT, NS, name, {"status": {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": pods, "updatedReplicas": pods, "readyReplicas": pods, "availableReplicas": pods,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
    }}, subresource="status")
    await wait_for(lambda: _condition(api, name, "Ready").get("status") == "True")
    return int(pods)


@pytest.mark.parametrize("rule_name", sorted(RULES))
async def test_rule_refuses_then_a_loosened_rule_builds_and_a_refused_edit_changes_nothing(
    cluster: ClusterEmulator, api: Api, rule_name: str
) -> None:
    rule = RULES[rule_name]
    name = rule.example
    for secret, key in SECRETS.items():
        await api.create(h.fake_secret(secret, NS, {key: SECRET_VALUE}))
    for secret in ("unlabelled-nats", "other-unlabelled"):
        await api.create(h.fake_secret(secret, NS, {"user.creds": SECRET_VALUE}, usable=False))

    # Refused on create: the condition and a Warning Event name the rule; nothing is built.
    async with embedded_operator(str(cluster.url), config=rule.strict):
        await api.create(_resource(rule.example, rule.ask))
        degraded = await _refused(api, name, rule.reason, generation=1)
        await asyncio.sleep(3 * FAST.status_interval)  # the timer's re-checks build nothing either
        assert _children(api, name) == {}
        print(f"\n{rule_name}: {degraded['message']}")
        if rule.loose is None:  # the Secret's owner opts it in: the next re-check builds it
            await api.patch(naming.SECRET, NS, "unlabelled-nats",
                            {"metadata": {"labels": {policy.USABLE_LABEL: policy.USABLE_VALUE}}})
            await wait_for(lambda: ALWAYS <= set(_children(api, name)))
    loose = rule.loose or rule.strict

    # The administrator loosens the rule (new flags restart the operator): its resync builds it all.
    async with embedded_operator(str(cluster.url), config=loose):
        await wait_for(lambda: ALWAYS <= set(_children(api, name)))
        await wait_for(lambda: _condition(api, name, "Degraded").get("status") == "False")
        assert rule.shows(api, name)
        pods = await _healthy_pods(api, name)
        before = _children(api, name)

        # An edit the rule refuses: the running children stay exactly as they were.
        await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": rule.still_refused})
        degraded = await _refused(api, name, rule.reason, generation=2)
        await asyncio.sleep(3 * FAST.status_interval)
        assert _children(api, name) == before
        ready = _condition(api, name, "Ready")
        assert f"{pods} pods of the previous configuration ready" in ready["message"]
        print(f"{rule_name} (edit): {degraded['message']}")

    # Secret values never reach a ConfigMap, the status or an Event (names only).
    for text in (str(before), str(_status(api, name)), *map(str, api.events(NS, name))):
        assert "never-shown" not in text
    if rule_name == "host":  # the refused host was never contacted: no status read named it
        assert {e["reason"] for e in api.events(NS, name) if "::1" in e["message"]} == {rule.reason}


async def test_unlabelling_a_secret_stops_the_operator_reading_it(api: Api, operator: Reconciler) -> None:
    """The owner withdraws a Secret: the next status read refuses its values, the next pass the
    resource, and the running children stay as they were (stopping pods is the owner's call)."""
    await api.create(h.fake_secret("city1-nats", NS, {"user.creds": SECRET_VALUE}))
    await api.create(_resource("cmdb-city1"))
    await wait_for(lambda: ALWAYS <= set(_children(api, "cmdb-city1")))
    await wait_for(lambda: "LagUnavailable" in api.reasons(NS, "cmdb-city1"))  # nothing listens there
    before = _children(api, "cmdb-city1")

    await api.patch(naming.SECRET, NS, "city1-nats", {"metadata": {"labels": {policy.USABLE_LABEL: None}}})
    await wait_for(lambda: any("no longer labelled" in e["message"] for e in api.events(NS, "cmdb-city1")))
    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"maxAge": "2h"}})
    await _refused(api, "cmdb-city1", policy.SECRET_NOT_ALLOWED, generation=2)
    assert _children(api, "cmdb-city1") == before
