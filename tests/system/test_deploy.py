"""An install without Helm reaches Ready: deploy/'s plain manifests applied in their order (as the
docs' recipe does), the operator run as deploy/'s Deployment says, with its default peering (the
ClusterKopfPeering and kopf's CRDs from deploy/), and a StreamReplication it serves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kmock
import yaml

from replicator.demo.local_nats import LocalNatsServer
from tests.support.system.cluster import SystemCluster
from tests.support.system.installed import REPO
from tests.support.system.kubelet import Kubelet
from tests.support.system.scenario import NS, add_stream, replication

DEPLOY = REPO / "deploy"


async def test_an_install_from_deploy_reaches_ready(
    tmp_path: Path, source_server: LocalNatsServer, target_server: LocalNatsServer
) -> None:
    await add_stream(source_server.url, "CMDB", ["acme.cmdb.>"])
    async with SystemCluster() as cluster, kmock.Server(cluster):
        await cluster.send("POST", "/api/v1/namespaces",
                           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for path in sorted(DEPLOY.glob("*.yaml")):
            objects = [d for d in yaml.safe_load_all(path.read_text()) if d]
            await cluster.install(objects, "default")
        (deployment,) = cluster.objects_of("apps/v1", "Deployment")
        assert "--peering=stream-replicator" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        async with Kubelet(cluster, tmp_path / "pods") as kubelet:
            await cluster.apply(replication("cmdb", source_server.url, target_server.url, "CMDB", "acme.cmdb.>",
                                            mode="ordered"))

            def ready() -> bool:
                found = [r for r in cluster.objects_of("streamreplicator.io/v1alpha1", "StreamReplication", NS)]
                conditions = (found[0].get("status") or {}).get("conditions") or [] if found else []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            for _ in range(120):
                if ready():
                    break
                await asyncio.sleep(0.5)
            assert ready(), kubelet.logs()[-4000:]
            (operator,) = kubelet.pods("stream-replicator", "stream-replicator")
            assert operator.process.running
