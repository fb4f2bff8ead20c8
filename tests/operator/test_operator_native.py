"""The native engine against real servers: a 'site' (source, JetStream domain `leaf`) joined to a
'hub' (target, domain `hub`) by a leafnode, the real operator over the API emulator.

NATS copies through the source entry the operator writes into the hub's stream; these tests read
what landed, the stream's config (the foreign entry beside ours) and the resource's status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from replication_operator.engine import choice as engine
from replication_operator.engine import entry as native
from replication_operator.model import naming
from replication_operator.reconcile.reconciler import Reconciler

from replicator.demo.local_nats import LocalNatsServer
from tests.operator.helpers import Api
from tests.operator.pods import Kubelet
from tests.support.kube_emulator import ClusterEmulator, wait_for
from tests.support.leafnodes import leaf_and_hub

NS = "native"
LEAF_API = "$JS.leaf.API"


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNatsServer, LocalNatsServer]]:
    """(leaf, hub): the leaf connects to the hub's leafnode port."""
    with leaf_and_hub(tmp_path_factory.mktemp("leaf"), tmp_path_factory.mktemp("hub")) as linked:
        yield linked


@pytest.fixture
async def site_ncs(sites: tuple[LocalNatsServer, LocalNatsServer]) -> AsyncIterator[tuple[Client, Client]]:
    leaf, hub = sites
    leaf_nc, hub_nc = await nats.connect(leaf.url), await nats.connect(hub.url)

    async def linked() -> bool:  # the leaf's JetStream answers on the hub through the domain
        try:
            await hub_nc.request(f"{LEAF_API}.INFO", b"", timeout=0.5)
            return True
        except Exception:
            return False

    await wait_for(linked, within=15, interval=0.1)
    yield leaf_nc, hub_nc
    await leaf_nc.close()
    await hub_nc.close()


def resource(name: str, leaf: LocalNatsServer, hub: LocalNatsServer, **spec: Any) -> dict[str, Any]:
    source = {"url": leaf.url, "stream": "FLEET", **spec.pop("source", {"domain": "leaf"})}
    target = {"url": hub.url, "stream": "FLEET_HUB", "subjectPrefix": "hub", **spec.pop("target", {})}
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"topic": "fleet.>", "source": source, "target": target, **spec},
    }


async def api_call(nc: Client, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body).encode() if body is not None else b"", timeout=5)
    data = dict(json.loads(msg.data))
    assert "error" not in data, data
    return data


async def stream_config(nc: Client, name: str) -> dict[str, Any]:
    return dict((await api_call(nc, f"STREAM.INFO.{name}"))["config"])


async def messages(nc: Client, stream: str) -> list[tuple[str, dict[str, str]]]:
    """(subject, headers) of every message in the stream, in order (an ephemeral pull consumer)."""
    js = nc.jetstream()
    last = (await js.stream_info(stream)).state.last_seq
    info = await js.add_consumer(stream, ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=10.0))
    sub = await js.pull_subscribe_bind(info.name, stream)
    found: list[tuple[str, dict[str, str]]] = []
    try:
        seq = 0
        while seq < last:
            for msg in await sub.fetch(1000, timeout=5):
                found.append((msg.subject, dict(msg.headers or {})))
                seq = msg.metadata.sequence.stream
    finally:
        await sub.unsubscribe()
        await js.delete_consumer(stream, info.name)
    return found


def source_sequences(found: list[tuple[str, dict[str, str]]], subject_prefix: str) -> list[int]:
    """The source sequence of each copy on our subjects, whichever engine copied it."""
    seqs = []
    for subject, headers in found:
        if not subject.startswith(subject_prefix):
            continue
        header = headers.get(native.SOURCE_HEADER) or headers.get("Stream-Replicator-Source") or ""
        seqs.append(int(header.split(" ")[1]))
    return seqs


async def publish(nc: Client, subject: str, count: int, start: int = 0) -> None:
    js = nc.jetstream()
    futures = [await js.publish_async(f"{subject}.n{i % 50}", f'{{"n": {i}}}'.encode())
               for i in range(start, start + count)]
    await asyncio.gather(*futures)


def condition(api: Api, name: str, kind: str) -> dict[str, Any]:
    obj = api.get(naming.STREAM_REPLICATION, NS, name) or {}
    return next((dict(c) for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def status(api: Api, name: str) -> dict[str, Any]:
    return dict((api.get(naming.STREAM_REPLICATION, NS, name) or {}).get("status") or {})


async def test_native_engine_copies_beside_a_foreign_source(
    api: Api, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer], site_ncs: tuple[Client, Client],
) -> None:
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    leaf_js = leaf_nc.jetstream()
    await leaf_js.add_stream(name="FLEET", subjects=["fleet.>"])
    await leaf_js.add_stream(name="OTHER", subjects=["other.>"])
    # The hub's stream exists, with somebody else's source entry (and settings) the operator must keep.
    foreign = {"name": "OTHER", "filter_subject": "other.>", "external": {"api": LEAF_API}}
    await api_call(hub_nc, "STREAM.CREATE.FLEET_HUB", {
        "name": "FLEET_HUB", "subjects": ["local.>"], "storage": "file", "max_msgs_per_subject": 100_000,
        "sources": [foreign], "description": "the hub's own",
    })
    foreign = (await stream_config(hub_nc, "FLEET_HUB"))["sources"][0]  # as the server keeps it
    await publish(leaf_nc, "other", 20)
    await publish(leaf_nc, "fleet", 10_000)

    name = "fleet-native"
    await api.create(resource(name, leaf, hub, engine="native"))
    await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=20)
    assert status(api, name)["engine"] == "native"
    assert condition(api, name, engine.CONDITION)["reason"] == engine.REQUESTED
    assert api.get(naming.DEPLOYMENT, NS, name) is None, "the native engine runs no pods"

    async def landed(count: int) -> bool:
        return source_sequences(await messages(hub_nc, "FLEET_HUB"), "hub.fleet.") == list(range(1, count + 1))

    await wait_for(lambda: landed(10_000), within=60, interval=0.5)
    found = await messages(hub_nc, "FLEET_HUB")
    ours = [(s, h) for s, h in found if s.startswith("hub.")]
    assert {s.split(".")[1] for s, _ in ours} == {"fleet"}, "subject transform: hub.fleet.*"
    # The server names our entry in every copy as the operator expects (it finds handovers by it).
    assert ours[-1][1][native.SOURCE_HEADER].startswith(f"FLEET:{native.api_hash(LEAF_API)} 10000 fleet.> hub.fleet.> ")
    assert sum(1 for s, _ in found if s.startswith("other.")) == 20, "the foreign source still copies"
    config = await stream_config(hub_nc, "FLEET_HUB")
    assert config["sources"][0] == foreign and len(config["sources"]) == 2
    assert config["description"] == "the hub's own" and config["subjects"] == ["local.>"]
    ours_entry = config["sources"][1]
    assert ours_entry["name"] == "FLEET" and ours_entry["external"]["api"] == LEAF_API
    assert ours_entry["subject_transforms"] == [{"src": "fleet.>", "dest": "hub.fleet.>"}]
    await wait_for(lambda: status(api, name).get("lag") == 0 and status(api, name).get("lastActive"))
    assert status(api, name)["native"]["stream"] == "FLEET_HUB"

    # Drift: the entry removed by hand comes back, and NATS goes on from where it was.
    await api_call(hub_nc, "STREAM.UPDATE.FLEET_HUB", {**config, "sources": [foreign]})
    await wait_for(lambda: "Restored" in api.reasons(NS, name), within=10)
    await publish(leaf_nc, "fleet", 100, start=10_000)
    await wait_for(lambda: landed(10_100), within=20, interval=0.3)
    # Drift: our entry edited by hand (its destination) is put back.
    edited = [foreign, {**ours_entry, "subject_transforms": [{"src": "fleet.>", "dest": "elsewhere.fleet.>"}]}]
    await api_call(hub_nc, "STREAM.UPDATE.FLEET_HUB", {**config, "sources": edited})
    await wait_for(lambda: "Reverted" in api.reasons(NS, name), within=10)
    assert (await stream_config(hub_nc, "FLEET_HUB"))["sources"][1]["subject_transforms"] == [
        {"src": "fleet.>", "dest": "hub.fleet.>"}]
    await publish(leaf_nc, "fleet", 100, start=10_100)
    await wait_for(lambda: landed(10_200), within=20, interval=0.3)

    # The spec moves the entry (another prefix: a new source to NATS): the new one goes on after
    # the last message the old one delivered, under the new subjects.
    await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"target": {"subjectPrefix": "hub2"}}})
    await wait_for(lambda: "SourceMoved" in api.reasons(NS, name), within=10)
    await publish(leaf_nc, "fleet", 100, start=10_200)

    async def moved() -> bool:
        found = await messages(hub_nc, "FLEET_HUB")
        return source_sequences(found, "hub2.fleet.") == list(range(10_201, 10_301))

    await wait_for(moved, within=20, interval=0.3)
    config = await stream_config(hub_nc, "FLEET_HUB")
    assert [s.get("subject_transforms") for s in config["sources"]] == [
        None, [{"src": "fleet.>", "dest": "hub2.fleet.>"}]]

    # Deleted: our entry goes, the stream, its messages and the foreign entry stay.
    await api.delete(naming.STREAM_REPLICATION, NS, name)
    await wait_for(lambda: api.get(naming.STREAM_REPLICATION, NS, name) is None, within=15)
    config = await stream_config(hub_nc, "FLEET_HUB")
    assert config["sources"] == [foreign]
    assert await landed(10_200) and await moved()
    assert "SourceRemoved" in api.reasons(NS, name)


async def test_auto_chooses_each_engine_for_its_reason(
    api: Api, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer], site_ncs: tuple[Client, Client],
) -> None:
    leaf, hub = sites
    leaf_nc, _ = site_ncs
    await leaf_nc.jetstream().add_stream(name="AUTO", subjects=["auto.>"])
    cases = {
        "reachable": ({"source": {"domain": "leaf", "stream": "AUTO"}}, engine.NATIVE, engine.SOURCE_REACHABLE),
        "sampled": ({"source": {"domain": "leaf", "stream": "AUTO"},
                     "sampling": {"inspect": "sender", "age": "5m"}}, engine.REPLICATOR, engine.NEEDS_REPLICATOR),
        "no-route": ({"source": {"stream": "AUTO"}}, engine.REPLICATOR, engine.NO_ROUTE),
        "unreachable": ({"source": {"domain": "nowhere", "stream": "AUTO"}}, engine.REPLICATOR,
                        engine.SOURCE_UNREACHABLE),
    }
    for case, (spec, _, _) in cases.items():
        body = resource(f"auto-{case}", leaf, hub, target={"stream": f"AUTO_{case.upper().replace('-', '_')}"}, **spec)
        body["spec"]["topic"] = "auto.>"
        await api.create(body)
    for case, (_, chosen, reason) in cases.items():
        name = f"auto-{case}"
        await wait_for(lambda name=name: condition(api, name, engine.CONDITION).get("reason"), within=15)
        cond = condition(api, name, engine.CONDITION)
        assert (cond["reason"], cond["message"].split(":")[0]) == (reason, chosen), cond
        if chosen == engine.NATIVE:
            await wait_for(lambda name=name: status(api, name).get("engine") == "native", within=10)
            assert api.get(naming.DEPLOYMENT, NS, name) is None
        else:
            await wait_for(lambda name=name: api.get(naming.DEPLOYMENT, NS, name), within=10)
            assert status(api, name).get("engine") == "replicator"
    assert "through JetStream domain \"nowhere\"" in condition(api, "auto-unreachable", engine.CONDITION)["message"]
    assert "spec.sampling" in condition(api, "auto-sampled", engine.CONDITION)["message"]



class Publisher:
    """Publishes to the source without pause until stopped; `count` messages so far."""

    def __init__(self, nc: Client, subject: str) -> None:
        self.nc, self.subject, self.count = nc, subject, 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        js = self.nc.jetstream()
        while not self._stop.is_set():
            futures = [await js.publish_async(f"{self.subject}.n{i % 20}", f'{{"n": {i}}}'.encode())
                       for i in range(self.count, self.count + 25)]
            await asyncio.gather(*futures)
            self.count += len(futures)
            await asyncio.sleep(0.02)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> int:
        self._stop.set()
        assert self._task is not None
        await self._task
        return self.count


async def publishing(leaf_nc: Client, body: dict[str, Any], stream: str, prefix: str) -> Publisher:
    """Point `body` at a new leaf stream `stream` of `prefix`.> and start publishing to it."""
    await leaf_nc.jetstream().add_stream(name=stream, subjects=[f"{prefix}.>"])
    body["spec"].update(topic=f"{prefix}.>")
    body["spec"]["source"]["stream"] = stream
    publisher = Publisher(leaf_nc, prefix)
    publisher.start()
    return publisher


@pytest.mark.slow
async def test_engine_switches_lose_and_repeat_nothing(
    api: Api, cluster: ClusterEmulator, operator: Reconciler, sites: tuple[LocalNatsServer, LocalNatsServer],
    site_ncs: tuple[Client, Client], tmp_path: Path,
) -> None:
    """replicator -> native -> replicator while the source is written without pause: every source
    message lands exactly once, in order, whichever engine copied it."""
    leaf, hub = sites
    leaf_nc, hub_nc = site_ncs
    cluster.hold_foreground = True  # the Deployment goes only once the kubelet below stopped its pod
    name = "switching"
    body = resource(name, leaf, hub, engine="replicator", target={"stream": "SWITCH_HUB"})
    publisher = await publishing(leaf_nc, body, "SWITCH", "switch")

    async def landed() -> list[int]:
        try:
            return source_sequences(await messages(hub_nc, "SWITCH_HUB"), "hub.switch.")
        except nats.js.errors.NotFoundError:
            return []

    async def grows(by: int) -> None:
        before = len(await landed())
        await wait_for(lambda: _longer(landed, before + by), within=30, interval=0.3)

    async with Kubelet(api, NS, name, tmp_path) as kubelet:
        await api.create(body)
        await grows(500)  # the replicator's pod copies
        assert kubelet.starts == 1
        await wait_for(lambda: "consumer" in status(api, name), within=30)

        await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "native"}})
        await wait_for(lambda: condition(api, name, "Ready").get("reason") == "Sourcing", within=30)
        assert kubelet.proc is None and kubelet.exit_codes == [0]
        assert api.get(naming.DEPLOYMENT, NS, name) is None and api.get(naming.CONFIGMAP, NS, f"{name}-config") is None
        # The replicator's durable on the source goes too, once its pod is gone (status.consumer follows).
        await wait_for(lambda: "consumer" not in status(api, name), within=30)
        assert await leaf_nc.jetstream().consumers_info("SWITCH") == []
        handed = status(api, name)["native"]["start"]["sequence"]
        await grows(500)  # NATS copies

        await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "replicator"}})
        await wait_for(lambda: kubelet.starts == 2, within=30)
        after = status(api, name)
        assert after["engine"] == "replicator" and after.get("resumeAfter", 0) >= handed
        assert (await stream_config(hub_nc, "SWITCH_HUB")).get("sources") in (None, [])
        await grows(500)  # the replicator's new pod copies again
        # Back to native now would make NATS resume its earlier entry (it remembers where that
        # stopped) and copy again what the replicator copied since: refused, the pod keeps copying.
        await api.patch(naming.STREAM_REPLICATION, NS, name, {"spec": {"engine": "native"}})
        await wait_for(lambda: condition(api, name, "Degraded").get("reason") == engine.NATIVE_WOULD_REPEAT)
        assert kubelet.starts == 2 and kubelet.proc is not None and kubelet.proc.poll() is None
        await grows(200)

        published = await publisher.stop()
        await wait_for(lambda: _longer(landed, published), within=60, interval=0.5)
        seqs = await landed()
    lost = sorted(set(range(1, published + 1)) - set(seqs))
    duplicated = len(seqs) - len(set(seqs))
    print(f"\nengine switches under load: {published} published, {len(seqs)} landed, "
          f"handover at {handed} and {after.get('resumeAfter')}, lost {len(lost)}, duplicated {duplicated}")
    assert (lost, duplicated) == ([], 0)
    assert seqs == list(range(1, published + 1)), "in order"
    assert "StoppingReplicator" in api.reasons(NS, name) and "SourceRemoved" in api.reasons(NS, name)


async def _longer(landed: Any, count: int) -> bool:
    return len(await landed()) >= count
