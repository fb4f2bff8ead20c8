"""The native engine's health and lag, against real servers whose link can be cut: a 'site' (source,
JetStream domain `leaf`) joined to a 'hub' (target, domain `hub`) by a leafnode through a TCP proxy,
the real operator over the API emulator, its `/metrics` scraped over HTTP as Prometheus would.

NATS's own lag for a source entry freezes while the link is down (and its `active` stays under a
second); the operator's keeps counting from the source's own servers, so the workers' lag series
(and the chart's alerts on them) see a native resource fall behind and catch up.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families
from replication_operator.metrics import NATIVE_METRIC_NAMES
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler
from replication_operator.settings import OperatorConfig

from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.operator.conftest import FAST
from tests.operator.helpers import Api
from tests.operator.test_operator_native import LEAF_API, NS, api_call, condition, publish, resource, status
from tests.operator.test_operator_native_mirror import publish_tagged, stored
from tests.support.kube_emulator import ClusterEmulator, embedded_operator, wait_for
from tests.support.tcp_proxy import TcpProxy

Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]


class LinkedSites:
    """(leaf, hub, proxy): the leaf reaches the hub's leafnode port only through `proxy`."""

    def __init__(self, leaf: LocalNatsServer, hub: LocalNatsServer, proxy: TcpProxy) -> None:
        self.leaf, self.hub, self.proxy = leaf, hub, proxy


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[LinkedSites]:
    # The hub does not advertise its leafnode address: the leaf would learn it and go round the proxy.
    port = free_port()
    hub = LocalNatsServer(name="hub", store_dir=tmp_path / "hub", domain="hub",
                          extra_config=f"leafnodes {{\n  listen: 127.0.0.1:{port}\n  no_advertise: true\n}}").start()
    proxy = await TcpProxy(port).start()
    leaf = LocalNatsServer(name="leaf", store_dir=tmp_path / "leaf", domain="leaf",
                           leafnode_remote=proxy.url).start()
    try:
        yield LinkedSites(leaf, hub, proxy)
    finally:
        await proxy.stop()
        leaf.close()
        hub.close()


async def joined(hub_nc: Client) -> bool:
    try:
        await hub_nc.request(f"{LEAF_API}.INFO", b"", timeout=0.5)
        return True
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False


def scrape(port: int) -> Sample:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Sample, metric: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    found = [v for (name, got), v in samples.items() if name == metric and wanted <= set(got)]
    return found[0] if len(found) == 1 else None


@pytest.mark.timeout(180)
async def test_native_lag_and_readiness_follow_a_cut_link(linked: LinkedSites, cluster: ClusterEmulator) -> None:
    leaf_nc, hub_nc = await nats.connect(linked.leaf.url), await nats.connect(linked.hub.url)
    api = Api(cluster)
    try:
        await wait_for(lambda: joined(hub_nc), within=15, interval=0.2)
        await leaf_nc.jetstream().add_stream(name="LAG", subjects=["lag.>"])
        await publish(leaf_nc, "lag", 2000)
        name = "lagging"
        body = resource(name, linked.leaf, linked.hub, engine="native", target={"stream": "LAG_HUB"},
                        native={"maxInactive": "3s", "maxLag": 1000})
        body["spec"].update(topic="lag.>")
        body["spec"]["source"]["stream"] = "LAG"
        series = {"namespace": NS, "name": naming.default_replicator_name(NS, name), "worker": "native"}
        ours = {"namespace": NS, "streamreplication": name}
        async with embedded_operator(str(cluster.url), config=FAST, metrics_port=0) as reconciler:
            port = metrics_port(reconciler)
            await api.create(body)
            await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=30)

            async def settled(lag: int, current: int, ready: int) -> Any:
                samples = await asyncio.to_thread(scrape, port)
                return (value(samples, "stream_replicator_lag_msgs", **series) == lag
                        and value(samples, "stream_replicator_current_sequence", **series) == current
                        and value(samples, "stream_replicator_resource_replicas_ready", **ours) == ready
                        and samples)

            healthy = await wait_for(lambda: settled(0, 2000, 1), within=20, interval=0.3)
            # A healthy native resource: one replica asked for, one ready (no pods by design).
            assert value(healthy, "stream_replicator_resource_replicas_desired", **ours) == 1
            assert value(healthy, "stream_replicator_native_source_error", **series) == 0
            assert value(healthy, "stream_replicator_native_inactive_seconds", **series) == 0
            # Every native series the dashboard and the alerts query (test_alerts.py counts on this scrape).
            assert {n for n, _ in healthy} >= set(NATIVE_METRIC_NAMES)

            # The link is cut: NATS's lag freezes, the operator's rises with what the source takes in.
            linked.proxy.cut()
            await publish(leaf_nc, "lag", 3000, start=2000)
            await wait_for(lambda: settled(3000, 2000, 0), within=30, interval=0.3)
            assert condition(api, name, "Ready")["reason"] in ("SourceInactive", "Lagging")
            assert status(api, name)["lag"] == 3000
            # Beyond maxInactive without a word from the source: Degraded, the silence exported.
            await wait_for(lambda: condition(api, name, "Degraded").get("reason") == "SourceInactive", within=15)
            cut = await wait_for(lambda: settled(3000, 2000, 0), within=5, interval=0.3)
            print(f"\nlink cut: lag {value(cut, 'stream_replicator_lag_msgs', **series):.0f}, "
                  f"inactive {value(cut, 'stream_replicator_native_inactive_seconds', **series):.1f}s")
            assert (value(cut, "stream_replicator_native_inactive_seconds", **series) or 0) > 3

            # The link is back: NATS catches up, the lag falls to 0 and the resource is Ready again.
            linked.proxy.restore()
            await wait_for(lambda: settled(0, 5000, 1), within=60, interval=0.3)
            await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=15)
            assert condition(api, name, "Degraded")["status"] == "False"
            assert status(api, name)["lag"] == 0

            # Deleted: its series go with it.
            await api.delete(naming.STREAM_REPLICATION, NS, name)
            await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, name) is None, within=15)

            async def gone() -> bool:
                return value(await asyncio.to_thread(scrape, port), "stream_replicator_lag_msgs", **series) is None

            await wait_for(gone, within=10)
    finally:
        await leaf_nc.close()
        await hub_nc.close()


def metrics_port(reconciler: Reconciler) -> int:
    assert reconciler.metrics_server is not None
    return reconciler.metrics_server.port


@pytest.mark.timeout(180)
async def test_nats_waiting_in_vain_is_found_and_repaired(linked: LinkedSites, cluster: ClusterEmulator) -> None:
    """A source stream created again while the operator was down, and already past the old one's
    last sequence: neither its creation time (never recorded) nor its sequences give it away. NATS
    reports lag 0 and copies nothing; the operator sees nothing arrive for maxInactive while the
    source holds more, and resets the entry: every message of both streams lands once."""
    leaf_nc, hub_nc = await nats.connect(linked.leaf.url), await nats.connect(linked.hub.url)
    api = Api(cluster)
    config = OperatorConfig(status_interval=0.3, resync_interval=2.0, nats_timeout=2.0)
    try:
        await wait_for(lambda: joined(hub_nc), within=15, interval=0.2)
        js = leaf_nc.jetstream()
        await js.add_stream(name="SIL", subjects=["sil.>"])
        await publish_tagged(leaf_nc, "sil", "old", 500)
        name = "silent"
        body = resource(name, linked.leaf, linked.hub, engine="native", target={"stream": "SIL_HUB"},
                        native={"form": "source", "maxInactive": "2s"})
        body["spec"].update(topic="sil.>")
        body["spec"]["source"]["stream"] = "SIL"

        async def landed() -> list[bytes]:
            return [m[2] for m in await stored(hub_nc, "SIL_HUB") if m[1].startswith("hub.sil.")]

        async def count(n: int) -> bool:
            try:
                info = await api_call(hub_nc, "STREAM.INFO.SIL_HUB", {"subjects_filter": "hub.sil.>"})
            except AssertionError:  # not created yet
                return False
            return sum((info["state"].get("subjects") or {}).values()) >= n

        async with embedded_operator(str(cluster.url), config=config):
            await api.create(body)
            await wait_for(lambda: count(500), within=30, interval=0.3)
            await wait_for(lambda: status(api, name)["native"].get("sourceCreated"), within=10)
        # The operator is down: the stream is created again, past the old one's last sequence, and
        # the creation time it had recorded is gone with it (as if it had never been read).
        await js.delete_stream("SIL")
        await js.add_stream(name="SIL", subjects=["sil.>"])
        await publish_tagged(leaf_nc, "sil", "new", 800)
        native_status = {k: v for k, v in status(api, name)["native"].items() if k != "sourceCreated"}
        await api.patch(naming.STREAM_REPLICATION, NS, name, {"status": {"native": None}}, subresource="status")
        await api.patch(naming.STREAM_REPLICATION, NS, name, {"status": {"native": native_status}},
                        subresource="status")
        async with embedded_operator(str(cluster.url), config=config):
            await wait_for(lambda: condition(api, name, "SourceRecreated").get("reason") == "Repaired", within=60)
            await wait_for(lambda: count(1300), within=30, interval=0.3)
            message = condition(api, name, "SourceRecreated")["message"]
        found = await landed()
        expected = {f"old{i}".encode() for i in range(500)} | {f"new{i}".encode() for i in range(800)}
        print(f"\nNATS waiting in vain: {len(found)} landed of {len(expected)}, lost {len(expected - set(found))}, "
              f"duplicated {len(found) - len(set(found))}; {message}")
        assert set(found) == expected and len(found) == len(expected)
        assert "NATS reports lag 0 but nothing arrived" in message
    finally:
        await leaf_nc.close()
        await hub_nc.close()
