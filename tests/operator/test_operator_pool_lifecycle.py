"""A pool's objects through the real operator over the API emulator (no workers run here; the pool's
copying is test_operator_pool.py's): owned by every member, every member's status from the pool's
pods, the pods changed one member at a time without a member dropping out, a member leaving for a
Deployment of its own and joining again (never running in both places), and the pool's objects
deleted with its last member."""

from __future__ import annotations

import asyncio
from typing import Any

import yaml
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator.helpers import Api
from tests.operator.test_operator_pool import NS, POOL, condition, member
from tests.support.kube_emulator import ClusterEmulator, wait_for

BASE = naming.pool_base(POOL)
RESOURCES = {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}}


def owners(api: Api, kind: naming.Kind, name: str) -> list[str] | None:
    obj = api.get(kind, NS, name)
    return None if obj is None else [r["name"] for r in obj["metadata"].get("ownerReferences") or []]


def profiles(api: Api) -> list[str]:
    configmap = api.get(naming.CONFIGMAP, NS, naming.configmap_name(BASE)) or {"data": {naming.CONFIG_KEY: "{}"}}
    return sorted(yaml.safe_load(configmap["data"][naming.CONFIG_KEY]).get("topics") or {})


def resources(api: Api) -> dict[str, Any] | None:
    deployment = api.get(naming.DEPLOYMENT, NS, BASE)
    return None if deployment is None else dict(deployment["spec"]["template"]["spec"]["containers"][0]["resources"])


async def test_a_pools_objects_follow_its_members(api: Api, cluster: ClusterEmulator, operator: Reconciler,
                                                  source_server: LocalNatsServer,
                                                  target_server: LocalNatsServer) -> None:
    urls: dict[str, Any] = {"source": source_server.url, "target": target_server.url}
    for name in ("a", "b"):
        await api.create(member(name, **urls))
    for kind, name in ((naming.DEPLOYMENT, BASE), (naming.CONFIGMAP, naming.configmap_name(BASE)),
                       (naming.SERVICE, naming.service_name(BASE))):
        found = await wait_for(lambda k=kind, n=name: owners(api, k, n) == ["a", "b"], within=10)
        assert found, owners(api, kind, name)
    assert profiles(api) == ["a", "b"]
    assert api.get(naming.DEPLOYMENT, NS, "a") is None and api.get(naming.DEPLOYMENT, NS, "b") is None

    # The pool's pods ready: every member says so in its own status.
    deployment = api.get(naming.DEPLOYMENT, NS, BASE) or {}
    await api.patch(naming.DEPLOYMENT, NS, BASE, {"status": {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 1, "availableReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}},
        subresource="status")
    for name in ("a", "b"):
        ready = await wait_for(lambda n=name: (c := condition(api, n, "Ready")) and c["status"] == "True" and c,
                               within=10)
        assert ready["reason"] == "Replicating", ready
        status = (api.get(naming.STREAM_REPLICATION, NS, name) or {})["status"]
        assert status["selector"] == naming.selector_string(BASE)  # the pool's pods (kubectl get pods -l)

    # The pool's pods changed one member at a time: the settings owner first; the other, refused
    # meanwhile, runs on with its last profile, then joins again.
    await api.patch(naming.STREAM_REPLICATION, NS, "a", {"spec": {"resources": RESOURCES}})
    assert await wait_for(lambda: resources(api) == RESOURCES, within=10)
    refused = await wait_for(lambda: (c := condition(api, "b", "Ready")) and c["reason"] == "PoolMismatch" and c,
                             within=10)
    assert "runs on" in refused["message"] and "containers[0].resources" in refused["message"]
    assert profiles(api) == ["a", "b"] and owners(api, naming.CONFIGMAP, naming.configmap_name(BASE)) == ["a", "b"]
    await api.patch(naming.STREAM_REPLICATION, NS, "b", {"spec": {"resources": RESOURCES}})
    assert await wait_for(lambda: (c := condition(api, "b", "Ready")) and c["reason"] != "PoolMismatch", within=10)

    # b leaves the pool for a Deployment of its own: out of the pool first, its own pods only once
    # the pool's workers have had the grace period (FAST: 2 s) to stop copying it.
    await api.patch(naming.STREAM_REPLICATION, NS, "b", {"spec": {"pool": None}})
    assert await wait_for(lambda: profiles(api) == ["a"], within=10), profiles(api)
    handover = await wait_for(lambda: (c := condition(api, "b", "Progressing")) and c["reason"] == "PoolHandover" and c,
                              within=10)
    assert "pool 'region'" in handover["message"] and "own worker Deployment" in handover["message"]
    assert api.get(naming.DEPLOYMENT, NS, "b") is None
    assert await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "b") is not None, within=10)
    assert await wait_for(lambda: owners(api, naming.DEPLOYMENT, BASE) == ["a"], within=10)

    # b joins again: its own pods are gone (a foreground deletion) before the pool runs it.
    cluster.hold_foreground = True
    await api.patch(naming.STREAM_REPLICATION, NS, "b", {"spec": {"pool": POOL}})
    assert await wait_for(lambda: (api.get(naming.DEPLOYMENT, NS, "b") or {}).get("metadata", {})
                          .get("deletionTimestamp"), within=10)
    await asyncio.sleep(1.0)
    assert profiles(api) == ["a"]  # not while its own pods may still copy
    await api.patch(naming.DEPLOYMENT, NS, "b", {"metadata": {"finalizers": []}})  # the pods are gone
    assert await wait_for(lambda: profiles(api) == ["a", "b"], within=10), profiles(api)
    assert await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "b") is None
                          and api.get(naming.CONFIGMAP, NS, "b-config") is None, within=10)
    cluster.hold_foreground = False

    # The settings owner goes: the pool stays, b's; the last member goes: so do the pool's objects.
    await api.delete(naming.STREAM_REPLICATION, NS, "a")
    assert await wait_for(lambda: owners(api, naming.DEPLOYMENT, BASE) == ["b"] and profiles(api) == ["b"], within=10)
    assert await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, "a") is None, within=15)  # after the grace
    await api.delete(naming.STREAM_REPLICATION, NS, "b")
    for kind, name in ((naming.DEPLOYMENT, BASE), (naming.CONFIGMAP, naming.configmap_name(BASE)),
                       (naming.SERVICE, naming.service_name(BASE))):
        assert await wait_for(lambda k=kind, n=name: api.get(k, NS, n) is None, within=15), name
    assert await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, "b") is None, within=15)


async def test_members_naming_a_shared_connection_share_a_pool_and_follow_its_edits(
        api: Api, operator: Reconciler, source_server: LocalNatsServer, target_server: LocalNatsServer) -> None:
    """Every member's profile in the pool's ConfigMap is built from the NatsConnection its source names,
    whichever member's pass rebuilds it; an edit of the connection reaches every member's profile."""
    await api.create({"apiVersion": naming.API_VERSION, "kind": naming.CONNECTION_KIND,
                      "metadata": {"name": "city-nats", "namespace": NS}, "spec": {"url": source_server.url}})
    for name in ("a", "b"):
        body = member(name, source_server.url, target_server.url)
        body["spec"]["source"] = {"connectionRef": {"name": "city-nats"}, "stream": name.upper()}
        await api.create(body)

    def source_urls() -> dict[str, Any]:
        configmap = api.get(naming.CONFIGMAP, NS, naming.configmap_name(BASE)) or {"data": {naming.CONFIG_KEY: "{}"}}
        topics = yaml.safe_load(configmap["data"][naming.CONFIG_KEY]).get("topics") or {}
        return {name: topic.get("source_url") for name, topic in topics.items()}

    assert await wait_for(lambda: source_urls() == {"a": source_server.url, "b": source_server.url}, within=10), \
        source_urls()
    # No worker runs here: any server stands for "another address" the edit points the members at.
    await api.patch(naming.NATS_CONNECTION, NS, "city-nats", {"spec": {"url": target_server.url}})
    assert await wait_for(lambda: source_urls() == {"a": target_server.url, "b": target_server.url}, within=10), \
        source_urls()
    for name in ("a", "b"):  # neither is refused by the other's pass (an unresolved spec would be InvalidSpec)
        assert await wait_for(lambda n=name: condition(api, n, "Stalled") is not None, within=10)
        assert (condition(api, name, "Stalled") or {}).get("status") == "False", condition(api, name, "Stalled")
