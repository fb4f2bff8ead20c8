"""What GitOps tools read from a resource, through kopf against the API emulator: Ready with its
reasons, Stalled for a permanent problem, Reconciling while work goes on, observedGeneration
throughout, each checked with kstatus's reading (tests/support/kstatus.py); and the pause
annotation, through the `stream-replicator-operator` process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler

from tests.operator import helpers as h
from tests.operator.helpers import Api
from tests.operator.test_operator_kopf import CREDS, NS, _resource
from tests.operator.test_operator_main import SCRIPT, _kubeconfig
from tests.support import kstatus
from tests.support.kube_emulator import ClusterEmulator, wait_for


def _obj(api: Api, name: str = "cmdb-city1") -> dict[str, Any]:
    return api.get(naming.STREAM_REPLICATION, NS, name) or {}


def _cond(api: Api, kind: str, name: str = "cmdb-city1") -> dict[str, Any]:
    for cond in (_obj(api, name).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def _observed_throughout(obj: dict[str, Any]) -> bool:
    generation = obj["metadata"]["generation"]
    status = obj.get("status") or {}
    return status.get("observedGeneration") == generation and all(
        c.get("observedGeneration") == generation for c in status.get("conditions") or [])


async def _mark_rolled_out(api: Api, replicas: int) -> None:
    deployment = api.get(naming.DEPLOYMENT, NS, "cmdb-city1") or {}
    await api.patch(naming.DEPLOYMENT, NS, "cmdb-city1", {"status": {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": replicas,
        "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}},
        subresource="status")


async def test_kstatus_reads_stalled_reconciling_and_ready(api: Api, operator: Reconciler) -> None:
    await api.create(_resource())
    # A missing Secret is permanent until someone creates it: Failed at once, not a timeout.
    await wait_for(lambda: _cond(api, "Stalled").get("status") == "True")
    assert _cond(api, "Stalled")["reason"] == "SecretMissing"
    assert _cond(api, "Reconciling")["status"] == "False"
    assert _observed_throughout(_obj(api))
    assert kstatus.compute(_obj(api)) == (kstatus.FAILED, _cond(api, "Stalled")["message"])

    await api.create(h.fake_secret("city1-nats", NS, CREDS))
    await wait_for(lambda: _cond(api, "Reconciling").get("status") == "True", within=5)
    assert _cond(api, "Stalled")["status"] == "False"
    assert kstatus.compute(_obj(api))[0] == kstatus.IN_PROGRESS
    await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"))
    await _mark_rolled_out(api, 1)
    await wait_for(lambda: _cond(api, "Ready").get("status") == "True")
    assert (_cond(api, "Reconciling")["status"], _cond(api, "Reconciling")["reason"]) == ("False", "RolloutComplete")
    assert kstatus.compute(_obj(api))[0] == kstatus.CURRENT

    # A new spec: Reconciling again, every condition of the new generation.
    await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"replicas": 2}})
    await wait_for(lambda: _obj(api)["status"].get("observedGeneration") == 2)
    await wait_for(lambda: _cond(api, "Reconciling").get("status") == "True")
    assert _observed_throughout(_obj(api))
    assert kstatus.compute(_obj(api))[0] == kstatus.IN_PROGRESS
    await _mark_rolled_out(api, 2)
    await wait_for(lambda: kstatus.compute(_obj(api))[0] == kstatus.CURRENT)
    assert _observed_throughout(_obj(api))


async def test_invalid_and_refused_specs_are_stalled(api: Api, operator: Reconciler) -> None:
    invalid, refused = _resource(), _resource()
    invalid["metadata"]["name"], refused["metadata"]["name"] = "invalid", "refused"
    invalid["spec"]["sampling"] = {"inspect": "host"}  # no age
    refused["spec"]["image"] = "registry.example/someone-else:1"
    await api.create(h.fake_secret("city1-nats", NS, CREDS))
    for resource, reason in ((invalid, "InvalidSpec"), (refused, "ImageNotAllowed")):
        name = resource["metadata"]["name"]
        await api.create(resource)
        await wait_for(lambda name=name: _cond(api, "Stalled", name).get("status") == "True")
        assert _cond(api, "Stalled", name)["reason"] == reason
        assert kstatus.compute(_obj(api, name))[0] == kstatus.FAILED
        assert _observed_throughout(_obj(api, name))


async def test_pause_annotation_through_the_operator_process(tmp_path: Path) -> None:
    """Paused: a spec change and a deleted child are left alone, the status says so; unpaused: both
    are put right."""
    async with ClusterEmulator() as cluster:
        from kmock import Server

        async with Server(cluster):
            api = Api(cluster)
            env = dict(os.environ, KUBECONFIG=str(_kubeconfig(tmp_path / "kubeconfig", str(cluster.url))))
            log = tmp_path / "operator.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen([SCRIPT, "--all-namespaces", "--standalone", "--liveness", ""], env=env,
                                        stdout=out, stderr=subprocess.STDOUT)
            try:
                await api.create(h.fake_secret("city1-nats", NS, CREDS))
                await api.create(_resource())
                deployment = await wait_for(lambda: api.get(naming.DEPLOYMENT, NS, "cmdb-city1"), within=30)
                configmap = api.get(naming.CONFIGMAP, NS, "cmdb-city1-config") or {}

                await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1",
                                {"metadata": {"annotations": {naming.PAUSED_ANNOTATION: "true"}}})
                await wait_for(lambda: _cond(api, "Paused").get("status") == "True", within=20)
                assert _cond(api, "Paused")["reason"] == "PausedByAnnotation"
                assert _cond(api, "Reconciling")["status"] == "False"
                await wait_for(lambda: "PausedByAnnotation" in api.reasons(NS, "cmdb-city1"))

                await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1", {"spec": {"replicas": 3}})
                await api.delete(naming.SERVICE, NS, "cmdb-city1-metrics")
                generation = _obj(api)["metadata"]["generation"]
                await asyncio.sleep(3)  # passes and child events go by; nothing may change
                now = api.get(naming.DEPLOYMENT, NS, "cmdb-city1") or {}
                assert now["spec"]["replicas"] == deployment["spec"]["replicas"] == 1
                assert (api.get(naming.CONFIGMAP, NS, "cmdb-city1-config") or {})["data"] == configmap["data"]
                assert api.get(naming.SERVICE, NS, "cmdb-city1-metrics") is None
                assert _obj(api)["status"]["observedGeneration"] < generation
                assert _cond(api, "Paused")["status"] == "True"

                await api.patch(naming.STREAM_REPLICATION, NS, "cmdb-city1",
                                {"metadata": {"annotations": {naming.PAUSED_ANNOTATION: None}}})
                await wait_for(lambda: (api.get(naming.DEPLOYMENT, NS, "cmdb-city1") or {})["spec"]["replicas"] == 3,
                               within=20)
                await wait_for(lambda: api.get(naming.SERVICE, NS, "cmdb-city1-metrics"), within=20)
                await wait_for(lambda: _obj(api)["status"].get("observedGeneration") == generation)
                assert _cond(api, "Paused") == {}
                await wait_for(lambda: "Resumed" in api.reasons(NS, "cmdb-city1"))
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
