"""A healthy native-engine resource, watched: a site's stream (JetStream domain `leaf`) sourced into
the hub's (domain `hub`) across a leafnode by NATS itself, no pods. It must fire no alert."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from replicator.demo.local_nats import LocalNatsServer
from tests.support.leafnodes import leaf_and_hub
from tests.support.system import seams
from tests.support.system.installed import installed, monitoring_values
from tests.support.system.scenario import API_VERSION, KIND, NS, trickle


@pytest.fixture
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNatsServer, LocalNatsServer]]:
    """(leaf, hub): the leaf connects to the hub's leafnode port."""
    with leaf_and_hub(tmp_path_factory.mktemp("leaf"), tmp_path_factory.mktemp("hub")) as linked:
        yield linked


async def _linked(hub: LocalNatsServer) -> None:
    nc = await nats.connect(hub.url)
    try:
        for _ in range(150):
            try:
                await nc.request("$JS.leaf.API.INFO", b"", timeout=0.5)
                return
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(0.1)
        raise AssertionError("the leaf's JetStream never answered through the hub")
    finally:
        await nc.close()


async def test_a_healthy_native_resource_fires_no_alert(
    tmp_path: Path, sites: tuple[LocalNatsServer, LocalNatsServer]
) -> None:
    leaf, hub = sites
    await _linked(hub)
    leaf_nc, hub_nc = await nats.connect(leaf.url), await nats.connect(hub.url)
    try:
        await leaf_nc.jetstream().add_stream(name="FLEET", subjects=["fleet.>"])
        created = await hub_nc.request("$JS.API.STREAM.CREATE.FLEET_HUB", json.dumps(
            {"name": "FLEET_HUB", "subjects": ["local.>"], "storage": "file"}).encode(), timeout=5)
        assert "error" not in json.loads(created.data)
    finally:
        await leaf_nc.close()
        await hub_nc.close()
    resource = {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "fleet", "namespace": NS},
        "spec": {"engine": "native", "topic": "fleet.>",
                 "source": {"url": leaf.url, "stream": "FLEET", "domain": "leaf"},
                 "target": {"url": hub.url, "stream": "FLEET_HUB", "subjectPrefix": "hub"}},
    }
    async with installed(tmp_path, monitoring_values(), [NS]) as system, trickle(leaf.url, ["fleet.a"]):
        await system.cluster.apply(resource)

        def sourcing() -> bool:
            conditions = ((system.resource(NS, "fleet") or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await system.until(sourcing, 60, "the native resource Ready")
        await system.until(lambda: system.prometheus.query(
            f'stream_replicator_resource_replicas_desired{{namespace="{NS}", streamreplication="fleet"}}'),
            30, "the operator's series of the native resource scraped")
        # Past the test's notReadyFor (5 s), twice over.
        await asyncio.sleep(12)
        assert seams.active_alerts(system) == []
        assert system.kubelet.pods(NS, "fleet") == []
