"""The pool's objects, pure (build/pool.py): one Deployment, ConfigMap and Service for every member,
valid for Kubernetes and loadable by the worker; a member change rewrites the ConfigMap alone; a
member whose pods differ is refused, naming the field and the pool's settings owner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from replication_operator.build.children import build_children
from replication_operator.build.pool import Member, build_pool
from replication_operator.model import naming
from replication_operator.model import status as st
from replication_operator.model.spec import parse_spec
from replication_operator.settings import OperatorConfig

from replicator.config import parse_config
from tests.operator import helpers as h

NS = "cities"
IMAGE = "registry.example/stream-replicator:1"


def resource(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": naming.API_VERSION, "kind": naming.KIND,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"topic": f"{name}.>", "source": {"url": f"nats://{name}.example:4222", "stream": name.upper()},
                 "target": {"url": "nats://region.example:4222", "stream": f"{name.upper()}_COPY"},
                 "engine": "replicator", "pool": "region", **spec},
    }


def member(name: str, **spec: Any) -> Member:
    return Member(parse_spec(resource(name, **spec)), f"uid-{name}")


def kinds(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_one_deployment_configmap_and_service_for_every_member() -> None:
    pool = build_pool("region", [member("a"), member("b"), member("c")], IMAGE)
    objects = kinds(pool.objects)
    assert set(objects) == {"Deployment", "ConfigMap", "Service"}
    for obj in pool.objects:
        h.validate_k8s(obj)
        assert obj["metadata"]["labels"][naming.LABEL_POOL] == "region"
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == ["uid-a", "uid-b", "uid-c"]
        assert not any(r.get("controller") for r in obj["metadata"]["ownerReferences"])
    deployment = objects["Deployment"]
    assert deployment["metadata"]["name"] == "region-pool"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["replicate", "--config", naming.CONFIG_PATH, "--reload"]
    assert naming.ANNOTATION_CONFIG_HASH not in deployment["spec"]["template"]["metadata"]["annotations"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "region-pool-config"
    config = parse_config(yaml.safe_load(objects["ConfigMap"]["data"][naming.CONFIG_KEY]))
    assert list(config.topics) == ["a", "b", "c"]
    assert config.topics["b"].name == "cities_b" and config.topics["b"].source_url == "nats://b.example:4222"
    assert objects["Service"]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {k for k, _ in [(k.kind, n) for k, n in pool.absent]} == {"PodDisruptionBudget", "ServiceMonitor"}


def test_a_member_change_rewrites_the_configmap_alone() -> None:
    before = kinds(build_pool("region", [member("a"), member("b"), member("c")], IMAGE).objects)
    after = kinds(build_pool("region", [member("a"), member("c", maxAge="1h"), member("d")], IMAGE).objects)
    assert after["Deployment"]["spec"] == before["Deployment"]["spec"]  # the pods do not roll
    assert after["ConfigMap"]["data"] != before["ConfigMap"]["data"]
    assert list(parse_config(yaml.safe_load(after["ConfigMap"]["data"][naming.CONFIG_KEY])).topics) == ["a", "c", "d"]
    rolled = kinds(build_pool("region", [member("a", image="registry.example/sr:2"), member("b")], IMAGE).objects)
    assert rolled["Deployment"]["spec"]["template"] != before["Deployment"]["spec"]["template"]


def test_a_mismatched_member_is_refused_naming_the_field_and_the_owner() -> None:
    members = [member("a"), member("b", image="registry.example/other:9"), member("c", replicas=2),
               member("d")]
    pool = build_pool("region", members, IMAGE)
    assert [m.name for m in pool.members] == ["a", "d"]
    reason, message = pool.refused["b"]
    assert reason == st.POOL_MISMATCH
    assert "'a'" in message and "spec.template.spec.containers[0].image" in message
    assert "registry.example/other:9" in message and IMAGE in message
    assert "spec.replicas" in pool.refused["c"][1]
    config = parse_config(yaml.safe_load(kinds(pool.objects)["ConfigMap"]["data"][naming.CONFIG_KEY]))
    assert list(config.topics) == ["a", "d"]


def test_secrets_are_pod_settings() -> None:
    secret = {"credentialsSecret": {"name": "city-creds", "key": "user.creds"}}
    a, b = member("a"), member("b")
    with_secret = Member(parse_spec({**resource("c"), "spec": {**resource("c")["spec"], "source": {
        **resource("c")["spec"]["source"], **secret}}}), "uid-c")
    pool = build_pool("region", [a, b, with_secret], IMAGE)
    assert "volumeMounts[3]" in pool.refused["c"][1] and "source-credentials" in pool.refused["c"][1]


def test_no_members_no_objects() -> None:
    pool = build_pool("region", [], IMAGE)
    assert pool.objects == [] and len(pool.absent) == 5


def test_a_member_builds_no_workers_of_its_own() -> None:
    children = build_children(member("a").spec)
    assert children.objects == []
    assert (naming.DEPLOYMENT, "a") in children.absent and (naming.CONFIGMAP, "a-config") in children.absent


def test_what_a_pool_cannot_share_is_refused_by_the_schema_and_the_model() -> None:
    for extra, words in [({"engine": "native", "source": {"url": "nats://a:4222", "stream": "A", "domain": "hub"}},
                          "pool needs the replicator engine"),
                         ({"networkPolicy": {"enabled": True}}, "pool cannot have networkPolicy.enabled")]:
        body = resource("a")
        body["spec"].update(extra)
        assert any(words in e for e in h.cr_errors(body)), h.cr_errors(body)
        try:
            parse_spec(body)
        except Exception as err:  # SpecError, in the same words
            assert words in str(err)
        else:
            raise AssertionError("the model took it")


def test_a_member_in_the_pool_keeps_its_running_profile_while_refused_or_paused() -> None:
    first = build_pool("region", [member("a"), member("b"), member("c")], IMAGE)
    running = yaml.safe_load(kinds(first.objects)["ConfigMap"]["data"][naming.CONFIG_KEY])["topics"]
    members = [member("a"), member("b", replicas=2, maxAge="1h"), member("c", maxAge="2h"), member("d", replicas=2)]
    pool = build_pool("region", members, IMAGE, running=running, paused={"c"})
    topics = yaml.safe_load(kinds(pool.objects)["ConfigMap"]["data"][naming.CONFIG_KEY])["topics"]
    assert sorted(topics) == ["a", "b", "c"]  # d, never in it, stays out
    assert topics["b"] == running["b"] and topics["c"] == running["c"]  # as they ran: no max_age
    assert "runs on" in pool.refused["b"][1] and "runs on" not in pool.refused["d"][1]
    assert "c" not in pool.refused
    owners = [r["name"] for r in kinds(pool.objects)["Deployment"]["metadata"]["ownerReferences"]]
    assert owners == ["a", "b", "c"]


def test_the_examples_pool_is_valid_and_loads_in_the_worker(tmp_path: Path) -> None:
    members = [Member(parse_spec(h.example(r["metadata"]["name"])), f"uid-{r['metadata']['name']}")
               for r in h.example_resources(pooled=True)]
    assert len(members) >= 2
    pool = build_pool(members[0].spec.pool or "", members, IMAGE)
    assert not pool.refused and len(pool.members) == len(members)
    objects = kinds(pool.objects)
    for obj in pool.objects:
        h.validate_k8s(obj)
    mounts = h.secret_mounts(objects["Deployment"])
    assert list(mounts.values()) == ["region-nats"]
    config = parse_config(h.materialise(pool.config_text, tmp_path, {"region-nats": {"user.creds": b"x"}}, mounts))
    assert sorted(config.topics) == sorted(m.name for m in members)


def test_the_grace_period_comes_from_the_environment() -> None:
    assert OperatorConfig.from_env({}).pool_reload_grace == 75.0
    assert OperatorConfig.from_env({"STREAM_REPLICATOR_POOL_RELOAD_GRACE": "5"}).pool_reload_grace == 5.0
