"""Pure builders: every object valid for Kubernetes, every ConfigMap loadable by the worker."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from replication_operator.build import worker_config, workload
from replication_operator.build.children import BuildOptions, Children, build_children
from replication_operator.checks.secrets import tls_problem
from replication_operator.model import naming
from replication_operator.model.spec import SpecError, parse_spec
from replication_operator.reconcile import apply

from replicator.config import Profile, parse_config
from tests.operator import helpers as h

# The fields of monitoring.coreos.com/v1 ServiceMonitor this operator writes (its CRD is not
# available offline; unknown fields are refused, so a typo fails here).
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^(0|(([0-9]+)(ms|s|m|h|d|w|y))+)$"},
                        },
                    },
                },
            },
        },
    },
}

SECRET_DATA = {
    "user.creds": b"-----BEGIN NATS USER JWT-----\nfake\n------END NATS USER JWT------\n",
    "replicator.creds": b"fake creds",
    "ca.crt": b"fake ca",
    "tls.crt": b"fake cert",
    "tls.key": b"fake key",
}


@functools.cache
def _spark_validator() -> jsonschema.Draft7Validator:
    """The served version's schema of the Spark operator's own CRD (../shared/external, not copied)."""
    path = h.SPARK_CRDS / "sparkoperator.k8s.io_scheduledsparkapplications.yaml"
    assert path.exists(), f"spark-operator CRDs missing: {path}"
    crd = yaml.safe_load(path.read_text())
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    return jsonschema.Draft7Validator(served[0]["schema"]["openAPIV3Schema"])


def _validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
    elif obj["kind"] == "ScheduledSparkApplication":
        _spark_validator().validate(obj)
    else:
        h.validate_k8s(obj)


def _children(name: str, **changes: Any) -> Children:
    resource = h.example(name)
    resource["spec"].update(changes)
    return build_children(parse_spec(resource))


def _config(children: Children) -> dict[str, Any]:
    return dict(yaml.safe_load(children.config_text))


def _topic(children: Children) -> dict[str, Any]:
    (topic,) = _config(children)["topics"].values()
    return dict(topic)


@pytest.mark.parametrize("resource", h.example_resources(pooled=False), ids=lambda r: r["metadata"]["name"])
def test_every_child_of_every_example_is_valid(resource: dict[str, Any]) -> None:
    resource = h.example(resource["metadata"]["name"])
    children = build_children(parse_spec(resource), BuildOptions(spark_image="stream-replicator:0.1.0-spark"))
    kinds = [o["kind"] for o in children.objects]
    assert kinds[:3] == ["ConfigMap", "Service", "Deployment"]
    for obj in children.objects:
        _validate(obj)
        assert obj["metadata"]["namespace"] == "replication"
        assert obj["metadata"]["labels"][naming.LABEL_MANAGED_BY] == naming.MANAGER


@pytest.mark.parametrize("resource", h.example_resources(pooled=False), ids=lambda r: r["metadata"]["name"])
def test_every_configmap_loads_in_the_worker(resource: dict[str, Any], tmp_path: Path) -> None:
    """The worker's own parse_config accepts it, with the mounted files materialised in tmp_path."""
    resource = h.example(resource["metadata"]["name"])
    resource["spec"].pop("fleetHealth", None)
    children = build_children(parse_spec(resource))
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    mounts = h.secret_mounts(deployment)
    secrets = {name: SECRET_DATA for name in mounts.values()}
    config = h.materialise(children.config_text, tmp_path, secrets, mounts)
    parsed = parse_config(config, "configmap")
    profile = Profile(parsed, resource["metadata"]["name"], instance="pod-abc")
    spec = parse_spec(resource)
    assert profile.consumer_name == spec.consumer_name
    assert all(name.startswith(f"{spec.replicator_name}_pod-abc_") for name in profile.worker_names())


def test_dead_letter_reaches_the_worker(tmp_path: Path) -> None:
    """`spec.deadLetter` becomes the worker's `dead_letter`, which the worker's own parser accepts;
    without it the worker skips poison messages (no key at all)."""
    assert "dead_letter" not in _topic(_children("cmdb-city1"))
    children = _children("cmdb-city1", deadLetter="replication.poison")
    assert _topic(children)["dead_letter"] == "replication.poison"
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    mounts = h.secret_mounts(deployment)
    config = h.materialise(children.config_text, tmp_path, {name: SECRET_DATA for name in mounts.values()}, mounts)
    parsed = parse_config(config, "configmap")
    assert Profile(parsed, "cmdb-city1").settings.dead_letter == "replication.poison"


def test_ordered_single_pod() -> None:
    children = _children("cmdb-city1")
    topic = _topic(children)
    assert topic["workers"] == 1 and topic["queued"] is False
    assert "leader_election" not in topic and "queue_group" not in topic
    assert topic["name"] == "replication_cmdb-city1"
    assert topic["start_at_end"] is True and topic["max_age"] == "1h"
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["replicas"] == 1
    assert h.child_of(children, naming.PDB) is None
    assert (naming.PDB, "cmdb-city1") in children.absent


def test_ordered_hot_standbys_elect_and_roll_one_by_one() -> None:
    children = _children("orders-eu")
    topic = _topic(children)
    assert topic["leader_election"] is True and topic["workers"] == 1
    assert topic["name"] == "ORDERS_EU_TO_CENTRAL"
    assert topic["target_create"] is False
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    strategy = deployment["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pdb = h.child_of(children, naming.PDB)
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1


def test_scaled_workers_share_a_queue_group() -> None:
    children = _children("telemetry-region")
    topic = _topic(children)
    assert (topic["workers"], topic["queued"], topic["queue_group"]) == (8, True, "telemetry_region_eu_grp")
    assert topic["target_subject_prefix"] == "eu" and topic["target_subject_remove"] == ".raw"
    assert topic["start_delta"] == "6h"
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 4
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0
    assert h.child_of(children, naming.SERVICE_MONITOR) is not None


def _without_group(namespace: str) -> dict[str, Any]:
    resource = h.example("telemetry-region", namespace)
    del resource["spec"]["queueGroup"]
    return resource


def test_default_names_are_deterministic_and_per_namespace() -> None:
    a = build_children(parse_spec(_without_group("team-a")))
    again = build_children(parse_spec(_without_group("team-a")))
    b = build_children(parse_spec(_without_group("team-b")))
    assert _topic(a)["queue_group"] == "team-a_telemetry-region_grp"
    assert _topic(a) == _topic(again) and a.config_hash == again.config_hash
    assert _topic(b)["queue_group"] == "team-b_telemetry-region_grp"
    assert _topic(a)["name"] == "team-a_telemetry-region"


def test_dots_in_resource_names_never_reach_jetstream_names() -> None:
    resource = h.example("cmdb-city1")
    resource["metadata"]["name"] = "cmdb.city1"
    assert _topic(build_children(parse_spec(resource)))["name"] == "replication_cmdb_city1"


@pytest.mark.parametrize(
    ("mode", "replicas", "workers", "asked", "expected"),
    [
        ("scaled", 2, 4, None, "kv"),
        ("scaled", 1, 4, "memory", "kv"),  # several workers in one pod still share senders
        ("scaled", 1, 1, None, "file"),
        ("ordered", 1, 1, None, "file"),
        ("ordered", 1, 1, "memory", "memory"),
        ("ordered", 3, 1, None, "kv"),  # standbys take over with the leader's state
    ],
)
def test_limiter_state(mode: str, replicas: int, workers: int, asked: str | None, expected: str) -> None:
    sampling: dict[str, Any] = {"inspectSubjectToken": 3, "age": "5m"}
    if asked:
        sampling["limiterState"] = asked
    children = _children("cmdb-city1", mode=mode, replicas=replicas, workersPerPod=workers, sampling=sampling)
    assert _topic(children)["limiter_state"] == expected
    assert _config(children)["state_dir"] == naming.STATE_DIR


def test_sampling_and_advisories_map_to_the_worker_keys() -> None:
    resource = h.example("registrations-region")
    resource["spec"].pop("fleetHealth")
    topic = _topic(build_children(parse_spec(resource)))
    assert topic["inspect_header"] == "Choria-Sender"
    assert (topic["age"], topic["update_flag"], topic["size_trigger"]) == ("30m", "force_update", 1024)
    assert topic["advisory"] == {
        "target": "replicator.advisories.registrations",
        "cluster": "target",
        "age": "15m",
    }


def test_pods_are_locked_down() -> None:
    deployment = h.child_of(_children("cmdb-city1"), naming.DEPLOYMENT)
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", naming.STATE_DIR}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["command"] == ["stream-replicator"]
    assert container["args"] == ["--config", "/etc/stream-replicator/config.yaml", "--topic", "cmdb-city1"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SR_INSTANCE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_secrets_are_mounted_read_only_and_named_in_the_config() -> None:
    children = _children("inventory-dc1")
    deployment = h.child_of(children, naming.DEPLOYMENT)
    assert deployment is not None
    mounts = h.secret_mounts(deployment)
    assert set(mounts.values()) == {"dc1-nats-creds", "dc1-nats-tls", "central-nats-creds", "central-ca"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] in mounts)
    topic = _topic(children)
    assert topic["source_credentials"] == f"{worker_config.credentials_dir('source')}/user.creds"
    assert topic["source_tls"] == {
        "scheme": "manual",
        "ca": f"{worker_config.tls_dir('source')}/ca.crt",
        "cert": f"{worker_config.tls_dir('source')}/tls.crt",
        "key": f"{worker_config.tls_dir('source')}/tls.key",
    }
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    creds = volumes["source-credentials"]["secret"]
    assert creds["items"] == [{"key": "user.creds", "path": "user.creds"}]


def test_tls_config_names_only_the_keys_the_secret_has() -> None:
    resource = h.example("inventory-dc1")
    keys = {"dc1-nats-tls": {"ca.crt", "tls.crt", "tls.key"}, "central-ca": {"ca.crt"}}
    topic = _topic(build_children(parse_spec(resource), BuildOptions(tls_keys=keys)))
    assert set(topic["target_tls"]) == {"scheme", "ca"}
    assert tls_problem({"ca.crt"}) is None
    assert tls_problem({"tls.crt", "tls.key"}) is None
    assert tls_problem({"tls.crt"}) == 'key "tls.key"'
    assert tls_problem(set()) is not None


def test_config_hash_rolls_pods_only_when_the_config_changes() -> None:
    base = _children("telemetry-region")
    more_pods = _children("telemetry-region", replicas=6)
    other_age = _children("telemetry-region", maxAge="2h")

    def pod_hash(children: Children) -> str:
        deployment = h.child_of(children, naming.DEPLOYMENT)
        assert deployment is not None
        return str(deployment["spec"]["template"]["metadata"]["annotations"][naming.ANNOTATION_CONFIG_HASH])

    assert pod_hash(base) == base.config_hash == pod_hash(more_pods)
    assert pod_hash(other_age) != pod_hash(base)


def test_safe_strategy_recreates_once_when_election_turns_on() -> None:
    single = h.child_of(_children("orders-eu", replicas=1), naming.DEPLOYMENT)
    elected = h.child_of(_children("orders-eu", replicas=3), naming.DEPLOYMENT)
    assert single is not None and elected is not None
    assert workload.safe_strategy(elected, single)["spec"]["strategy"] == {"type": "Recreate"}
    assert workload.safe_strategy(elected, elected)["spec"]["strategy"]["type"] == "RollingUpdate"
    assert workload.safe_strategy(elected, None) is elected
    assert workload.safe_strategy(single, elected)["spec"]["strategy"] == {"type": "Recreate"}


def test_optional_children_are_listed_as_absent_when_off() -> None:
    children = _children("cmdb-city1")
    absent = {(k.kind, n) for k, n in children.absent}
    assert absent == {
        ("PodDisruptionBudget", "cmdb-city1"),
        ("ServiceMonitor", "cmdb-city1"),
        ("NetworkPolicy", "cmdb-city1-workers"),
        ("ScheduledSparkApplication", "cmdb-city1-fleet-health"),
    }


def test_service_monitor_selects_the_metrics_service() -> None:
    children = _children("telemetry-region")
    service = h.child_of(children, naming.SERVICE)
    monitor = h.child_of(children, naming.SERVICE_MONITOR)
    assert service is not None and monitor is not None
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
    assert service["spec"]["ports"][0]["targetPort"] == naming.METRICS_PORT_NAME
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_invalid_worker_config_is_reported_not_built() -> None:
    resource = h.example("cmdb-city1")
    resource["spec"]["sampling"] = {"inspect": "host", "age": "5m"}
    resource["spec"]["sampling"]["updateFlag"] = "force"
    resource["spec"]["source"]["url"] = "nats://a b:4222"
    with pytest.raises(SpecError, match="source_url"):
        build_children(parse_spec(resource))
    with pytest.raises(SpecError, match="topic"):
        build_children(parse_spec({**resource, "spec": {k: v for k, v in resource["spec"].items() if k != "topic"}}))


def test_contains_ignores_server_defaults_but_not_edits() -> None:
    desired: dict[str, Any] = {
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}
    }
    live = copy.deepcopy(desired)
    live["spec"]["progressDeadlineSeconds"] = 600
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    assert apply.contains(live, desired)
    live["spec"]["replicas"] = 5
    assert not apply.contains(live, desired)
    live["spec"]["replicas"] = 2
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar"})
    assert not apply.contains(live, desired)


def test_fleet_health_builds_a_valid_scheduled_spark_application() -> None:
    resource = h.example("registrations-region")
    children = build_children(parse_spec(resource), BuildOptions(spark_image="stream-replicator:0.1.0-spark"))
    app = h.child_of(children, naming.SCHEDULED_SPARK_APPLICATION)
    assert app is not None
    _validate(app)
    assert app["metadata"]["name"] == "registrations-region-fleet-health"
    assert app["spec"]["schedule"] == "*/15 * * * *"
