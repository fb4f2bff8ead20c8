"""The real operator (kopf + handlers) against the API emulator: children, updates, drift, Secrets, status."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from replication_operator.build.children import build_children
from replication_operator.model import naming
from replication_operator.model.spec import parse_spec
from replication_operator.reconcile.reconciler import Reconciler

from tests.operator import helpers as h
from tests.operator.conftest import FAST
from tests.operator.helpers import Api
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for

NS = "replication"
CREDS = {"user.creds": b"-----BEGIN NATS USER JWT-----\nfake\n------END NATS USER JWT------\n"}


def _resource(name: str = "cmdb-city1") -> dict[str, Any]:
    """An example, with NATS URLs that refuse at once (the status timer tries them every 0.3 s)."""
    resource = h.example(name, NS)
    for key in ("uid", "generation"):
        resource["metadata"].pop(key)
    resource["spec"]["source"]["url"] = resource["spec"]["target"]["url"] = "nats://127.0.0.1:1"
    return resource


async def _create_with_secrets(api: Api, resource: dict[str, Any]) -> dict[str, Any]:
    await api.create(h.fake_secret("city1-nats", NS, CREDS))
    return await api.create(resource)


def _status(api: Api, name: str = "cmdb-city1") -> dict[str, Any]:
    obj = api.get(naming.STREAM_REPLICATION, NS, name) or {}
    return dict(obj.get("status") or {})


def _condition(api: Api, kind: str, name: str = "cmdb-city1") -> dict[str, Any]:
    for cond in _status(api, name).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def _pod_hash(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["annotations"][naming.ANNOTATION_CONFIG_HASH])


async def test_create_builds_owned_children_and_status(api: Api, operator: Reconciler) -> None:
    created = await _create_with_secrets(api, _resource())
    uid = created["metadata"]["uid"]

    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    configmap = api.get(naming.CONFIGMAP, NS, "cmdb-city1-config")
    service = api.get(naming.SERVICE, NS, "cmdb-city1-metrics")
    assert configmap is not None and service is not None
    expected = build_children(parse_spec(created))
    assert configmap["data"]["config.yaml"] == expected.config_text
    assert _pod_hash(deployment) == expected.config_hash
    for child in (deployment, configmap, service):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "name": "cmdb-city1",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert not child["metadata"].get("finalizers")
    assert api.get(naming.PDB, NS, "cmdb-city1") is None

    await wait_for(lambda: _status(api).get("observedGeneration") == 1)
    status = _status(api)
    assert status["selector"] == naming.selector_string("cmdb-city1")
    assert _condition(api, "Ready")["reason"] == "PodsNotReady"
    assert _condition(api, "Progressing")["status"] == "True"
    assert _condition(api, "Degraded")["status"] == "False"
    await wait_for(lambda: "Created" in api.reasons(NS, "cmdb-city1"))
    messages = [e["message"] for e in api.events(NS, "cmdb-city1")]
    assert "created Deployment cmdb-city1" in messages


async def test_create_to_deployment_latency(api: Api, operator: Reconciler) -> None:
    """From POSTing an example resource to its Deployment existing: well under a second."""
    await api.create(h.fake_secret("city1-nats", NS, CREDS))
    start = time.perf_counter()
    await api.create(_resource())
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"), within=5, interval=0.002)
    latency = time.perf_counter() - start
    print(f"\ncreate -> Deployment: {latency * 1000:.0f} ms")
    assert latency < 1.0


async def test_deployment_status_flows_into_the_resource(api: Api, operator: Reconciler) -> None:
    await _create_with_secrets(api, _resource())
    deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    await api.patch(
        naming.DEPLOYMENT,
        NS,
        "cmdb-city1",
        {
            "status": {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
                "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
            }
        },
        subresource="status",
    )
    await wait_for(lambda: _condition(api, "Ready").get("status") == "True")
    assert _condition(api, "Ready")["reason"] == "Replicating"
    assert _condition(api, "Progressing")["reason"] == "RolloutComplete"
    assert (_status(api)["replicas"], _status(api)["readyReplicas"]) == (1, 1)


async def test_update_changes_children_and_rolls_pods(api: Api, operator: Reconciler) -> None:
    await _create_with_secrets(api, _resource())
    before = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    await wait_for(lambda: _status(api).get("observedGeneration") == 1)

    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"maxAge": "2h"}})
    after = await wait_for(
        lambda: (
            (d := api.get(naming.DEPLOYMENT, NS, "cmdb-city1")) and _pod_hash(d) != _pod_hash(before) and d
        )
    )
    configmap = api.get(naming.CONFIGMAP, NS, "cmdb-city1-config")
    assert configmap is not None
    assert yaml.safe_load(configmap["data"]["config.yaml"])["topics"]["cmdb-city1"]["max_age"] == "2h"
    assert (
        _pod_hash(after)
        == build_children(parse_spec(api.get(naming.STREAM_REPLICATION, NS, "cmdb-city1") or {})).config_hash
    )
    await wait_for(lambda: _status(api).get("observedGeneration") == 2)
    await wait_for(lambda: any("rolling the pods" in e["message"] for e in api.events(NS, "cmdb-city1")))


async def test_scaling_up_turns_on_election_safely_and_adds_a_pdb(api: Api, operator: Reconciler) -> None:
    await _create_with_secrets(api, _resource())
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))

    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"replicas": 3}})
    pdb = await wait_for(lambda: api.get(naming.PDB, NS, "cmdb-city1"))
    assert pdb["spec"]["maxUnavailable"] == 1
    deployment = api.get(naming.DEPLOYMENT, NS, "cmdb-city1")
    assert deployment is not None and deployment["spec"]["replicas"] == 3
    # The rollout that turns election on replaces the lone non-electing pod first...
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    # ...and the next pass (any trigger) restores the rolling strategy for elected pods.
    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"metadata": {"labels": {"tier": "gold"}}})
    await wait_for(
        lambda: (
            (api.get(naming.DEPLOYMENT, NS, "cmdb-city1") or {})["spec"]["strategy"]["type"]
            == "RollingUpdate"
        )
    )

    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"replicas": 1}})
    await wait_for(lambda: api.get(naming.PDB, NS, "cmdb-city1") is None)
    await wait_for(lambda: "Deleted" in api.reasons(NS, "cmdb-city1"))


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (naming.DEPLOYMENT, "cmdb-city1"),
        (naming.CONFIGMAP, "cmdb-city1-config"),
        (naming.SERVICE, "cmdb-city1-metrics"),
    ],
)
async def test_deleted_child_is_restored(
    api: Api, operator: Reconciler, kind: naming.Kind, name: str
) -> None:
    await _create_with_secrets(api, _resource())
    original = await wait_for(lambda: api.get(kind, NS, name))
    await api.delete(kind, NS, name)
    restored = await wait_for(lambda: api.get(kind, NS, name))
    assert restored["metadata"]["uid"] != original["metadata"]["uid"]
    assert h.contains_fields(restored, original)
    await wait_for(lambda: "Restored" in api.reasons(NS, "cmdb-city1"))


async def test_hand_edits_are_put_back(api: Api, operator: Reconciler) -> None:
    await _create_with_secrets(api, _resource())
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    configmap = await wait_for(lambda: api.get(naming.CONFIGMAP, NS, "cmdb-city1-config"))

    await api.patch(naming.DEPLOYMENT, NS, "cmdb-city1", {"spec": {"replicas": 7}})
    await api.patch(naming.CONFIGMAP, NS, "cmdb-city1-config", {"data": {"config.yaml": "topics: {}\n"}})
    await wait_for(lambda: (api.get(naming.DEPLOYMENT, NS, "cmdb-city1") or {})["spec"]["replicas"] == 1)
    await wait_for(
        lambda: (api.get(naming.CONFIGMAP, NS, "cmdb-city1-config") or {})["data"] == configmap["data"]
    )
    await wait_for(lambda: "Reverted" in api.reasons(NS, "cmdb-city1"))


async def test_missing_secret_degrades_then_recovers(api: Api, operator: Reconciler) -> None:
    await api.create(_resource())
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "True")
    degraded = _condition(api, "Degraded")
    assert degraded["reason"] == "SecretMissing"
    assert (
        degraded["message"] == 'secret "city1-nats" (key "user.creds") not found in namespace "replication"'
    )
    assert _condition(api, "Ready")["reason"] == "SecretMissing"
    assert api.get(naming.DEPLOYMENT, NS, "cmdb-city1") is None
    await wait_for(lambda: "SecretMissing" in api.reasons(NS, "cmdb-city1"))

    await api.create(h.fake_secret("city1-nats", NS, {"other.creds": b"x"}))
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "SecretKeyMissing")
    assert 'has no key "user.creds"' in _condition(api, "Degraded")["message"]

    await api.patch(naming.SECRET, NS, "city1-nats", {"data": h.fake_secret("x", NS, CREDS)["data"]})
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"), within=5)
    await wait_for(lambda: _condition(api, "Degraded").get("status") == "False")
    await wait_for(lambda: "Recovered" in api.reasons(NS, "cmdb-city1"))
    for event in api.events(NS, "cmdb-city1"):
        assert "fake" not in event.get("message", ""), "a secret value leaked into an event"


async def test_invalid_spec_is_reported_and_builds_nothing(api: Api, operator: Reconciler) -> None:
    resource = _resource()
    resource["spec"]["sampling"] = {"inspect": "host"}  # no age: the API server would refuse it
    await _create_with_secrets(api, resource)
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "InvalidSpec")
    assert "sampling.age" in _condition(api, "Degraded")["message"]
    assert api.get(naming.CONFIGMAP, NS, "cmdb-city1-config") is None


async def test_foreign_object_with_a_child_name_is_left_alone(api: Api, operator: Reconciler) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cmdb-city1-config", "namespace": NS},
        "data": {"mine": "yes"},
    }
    await api.create(foreign)
    await _create_with_secrets(api, _resource())
    await wait_for(lambda: _condition(api, "Degraded").get("reason") == "NameConflict")
    assert (api.get(naming.CONFIGMAP, NS, "cmdb-city1-config") or {})["data"] == {"mine": "yes"}


async def test_delete_stops_the_workers_and_leaves_owned_children(api: Api, operator: Reconciler) -> None:
    created = await _create_with_secrets(api, _resource())
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    await wait_for(
        lambda: (
            (api.get(naming.STREAM_REPLICATION, NS, "cmdb-city1") or {}).get("metadata", {}).get("finalizers")
        )
    )
    await api.delete(naming.STREAM_REPLICATION, NS, "cmdb-city1")
    # The operator's finalizer stops the workers (their Deployment goes first: a running worker would
    # create the durable again) and deletes the durable; a source it never read does not hold it up.
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, "cmdb-city1") is None)
    assert api.get(naming.DEPLOYMENT, NS, "cmdb-city1") is None
    await wait_for(lambda: "DurableLeft" in api.reasons(NS, "cmdb-city1"))
    # The emulator has no garbage collector; the API server deletes these through their owner refs.
    for kind, name in (
        (naming.CONFIGMAP, "cmdb-city1-config"),
        (naming.SERVICE, "cmdb-city1-metrics"),
    ):
        child = api.get(kind, NS, name)
        assert child is not None
        assert child["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        assert not child["metadata"].get("finalizers")
    await wait_for(lambda: created["metadata"]["uid"] not in operator.memory)


async def test_restart_resumes_without_rewriting(cluster: ClusterEmulator, api: Api) -> None:
    """A second operator process finds everything in place: same names, no writes to children."""
    async with embedded_operator(str(cluster.url), config=FAST):
        resource = _resource("telemetry-region")
        del resource["spec"]["queueGroup"]  # the default name must come out the same after a restart
        del resource["spec"]["image"]  # the example's registry is not allowed by the default policy
        await _create_with_secrets(api, resource)
        await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "telemetry-region"))
        await wait_for(lambda: _status(api, "telemetry-region").get("observedGeneration") == 1)
    before = {
        k.plural: (api.get(k, NS, n) or {})["metadata"]["resourceVersion"]
        for k, n in ((naming.DEPLOYMENT, "telemetry-region"), (naming.CONFIGMAP, "telemetry-region-config"))
    }
    configmap = api.get(naming.CONFIGMAP, NS, "telemetry-region-config") or {}
    assert "queue_group: replication_telemetry-region_grp" in configmap["data"]["config.yaml"]

    async with embedded_operator(str(cluster.url), config=FAST) as second:
        await wait_for(lambda: len(second.memory) == 1)
        after = {
            k.plural: (api.get(k, NS, n) or {})["metadata"]["resourceVersion"]
            for k, n in (
                (naming.DEPLOYMENT, "telemetry-region"),
                (naming.CONFIGMAP, "telemetry-region-config"),
            )
        }
    assert after == before
