"""A clustered R3 target, as a centre runs it: fan-in and leader moves while a backlog is copied.

From server 2.14 a replica that finds a `Nats-Expected-Last-Msg-Id` mismatch while applying a
message stops the stream ("critical write error"), so nothing written to a replicated stream is
chained (`copier/batching.py`): a batch keeps its order by itself, a message written per message
goes alone. These scenarios would each stop the stream within a second if the chain were sent. The
final check is the fault suite's: nothing lost, duplicated or reordered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NotFoundError

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import WRITE_PATHS, InProcess, profile_for, publish_many, topic_config
from tests.faults.rig import BACKLOG, IN_FLIGHT, STREAM, Rig, copying
from tests.support.cluster import LocalCluster
from tests.support.faults import Outcome, stream_count, wait_count
from tests.support.tcp_proxy import ThreadedProxy

pytestmark = pytest.mark.slow

STEP_DOWNS = 3
# Per message a replicated target takes one copy at a time: a smaller backlog on that path, and no
# added latency (over 20 ms each way it would copy about 25 messages a second).
BACKLOGS = {"batch": BACKLOG, "message": 10_000}
RATES = {"batch": 400.0, "message": 100.0}  # continuous publishing on top: per message, about 500 copies a second


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("centre")).start()
    yield cluster
    cluster.close()


@pytest.fixture
async def cluster_rig(tmp_path: Path, source_server: LocalNatsServer, source_nc: Client, cluster: LocalCluster,
                      fault_results: list[Outcome]) -> AsyncIterator[tuple[Rig, list[ThreadedProxy]]]:
    """The fault rig with the cluster as its target, reached by the replicator through a proxy per node."""
    proxies = [ThreadedProxy(node.port).start() for node in cluster.nodes]
    rig = Rig(tmp_path, source_server, cluster.nodes[0], source_nc, source_nc, fault_results,
              target_urls=",".join(proxy.url for proxy in proxies))
    await rig.open()
    try:
        yield rig, proxies
    finally:
        await rig.close()
        for proxy in proxies:
            proxy.stop()


def target_config(path: str, replicas: int = 3) -> StreamConfig:
    """The target stream, with `allow_batched` for the batch path."""
    return StreamConfig(name=STREAM, subjects=["fleet.>"], num_replicas=replicas,
                        allow_batched=True if path == "batch" else None)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_target_leader_moves_in_the_middle_of_a_batch(cluster_rig: tuple[Rig, list[ThreadedProxy]],
                                                           cluster: LocalCluster, path: str) -> None:
    """The leader steps down three times, then its server is killed and started again, each time
    in the middle of a fast-ingest batch (or of the per-message copying): proposals lost with a
    leader end the batch with a gap; the worker learns from the target what landed and goes on."""
    rig, proxies = cluster_rig
    backlog = BACKLOGS[path]
    await rig.stream()
    await cluster.add_stream(rig.target_nc, target_config(path))
    await publish_many(rig.source_nc, backlog, size=64)
    if path == "batch":
        for proxy in proxies:
            proxy.set_delay(0.02)
    rig.write_config(max_in_flight=IN_FLIGHT[path])
    rig.publish(RATES[path])
    rig.spawn()
    leaders = [await cluster.leader(rig.target_nc, STREAM)]
    for i in range(STEP_DOWNS):
        await copying(rig, path, (i + 1) * backlog // 10, within=60)
        leaders.append(await cluster.step_down(rig.target_nc, STREAM))
    await copying(rig, path, (STEP_DOWNS + 1) * backlog // 10, within=60)
    leader = cluster.node(await cluster.leader(rig.target_nc, STREAM))
    assert await stream_count(rig.target_nc, STREAM) < backlog, "the backlog was copied before the kill"
    await rig.stop_server(leader, kill=True)
    await asyncio.sleep(2.0)
    began = time.monotonic()
    await rig.start_server(leader)
    recover = await rig.time_to_catch_up(began, within=90)
    await rig.finish(f"R3 target: leader stepped down {STEP_DOWNS} times, then killed, mid-batch ({path} path)",
                     recover_s=recover, faults=STEP_DOWNS + 1,
                     notes=f"{backlog:,} backlog; leaders {' -> '.join(leaders)}; recover: from the restart",
                     within=120)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_two_cities_fan_into_a_clustered_target_raised_to_r3(
        cluster_rig: tuple[Rig, list[ThreadedProxy]], cluster: LocalCluster, city2: LocalNatsServer, path: str) -> None:
    """Two cities' same-named streams copied at once into one stream of the cluster, R1 at first and
    raised to R3 halfway: the copies interleave all along, which would break a chain at every turn
    (and stop the stream once it is replicated)."""
    rig, _ = cluster_rig
    backlog = BACKLOGS[path] // 4
    await rig.add_city(city2)
    await rig.stream()
    await cluster.add_stream(rig.target_nc, target_config(path, replicas=1))
    assert rig.city is not None
    for nc in (rig.source_nc, rig.city.nc):
        await publish_many(nc, backlog, size=64)
    rig.write_config(max_in_flight=IN_FLIGHT[path])
    rig.publish(RATES[path])
    began = time.monotonic()
    rig.spawn()
    rig.spawn(city=True)
    assert await wait_count(rig.target_nc, STREAM, backlog, 60) is not None, rig.log_tail()
    await rig.target_nc.jetstream(timeout=10).update_stream(target_config(path))
    recover = await rig.time_to_catch_up(began, within=120)
    info = await rig.target_nc.jetstream().stream_info(STREAM)
    assert info.config.num_replicas == 3 and info.cluster is not None and info.cluster.leader
    await rig.finish(f"2 cities -> 1 clustered target, R1 raised to R3 midway ({path} path)", recover_s=recover,
                     faults=0, notes=f"2 x {backlog:,} backlog; recover: the whole copy", within=120)


async def test_a_chain_mismatch_stops_a_replicated_stream_on_this_server(cluster: LocalCluster) -> None:
    """Why nothing written to a clustered target is chained: on the bundled server (2.15) one
    publish whose Nats-Expected-Last-Msg-Id does not match is refused, and the stream then stops
    for good on every replica. Should a server fix this, this test says so."""
    nc = await nats.connect(cluster.urls.split(","))
    try:
        await cluster.add_stream(nc, StreamConfig(name="CANARY", subjects=["canary"], num_replicas=3))
        js = nc.jetstream(timeout=2)
        await js.publish("canary", b"1", headers={"Nats-Msg-Id": "a"})
        with pytest.raises(APIError) as refused:
            await js.publish("canary", b"2", headers={"Nats-Msg-Id": "b", "Nats-Expected-Last-Msg-Id": "x"})
        assert refused.value.err_code == 10070
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("canary", b"3", headers={"Nats-Msg-Id": "c"})
    finally:
        await nc.close()


@pytest.mark.timeout(180)
async def test_scaled_workers_through_r3_leader_moves(cluster_rig: tuple[Rig, list[ThreadedProxy]],
                                                      cluster: LocalCluster) -> None:
    """Scaled mode into an R3 stream (unordered by design, never chained): publishes lost with a
    leader that stepped down or was killed fail or time out, their messages are redelivered, and
    the duplicate window drops the copies that had landed."""
    rig, _ = cluster_rig
    await rig.stream()
    await cluster.add_stream(rig.target_nc, target_config("message"))
    await publish_many(rig.source_nc, BACKLOG // 4, size=64)
    rig.write_config(workers=4)
    rig.publish(RATES["batch"])
    rig.spawn()
    for i in range(STEP_DOWNS):
        assert await wait_count(rig.target_nc, STREAM, (i + 1) * BACKLOG // 20, 60) is not None, rig.log_tail()
        await cluster.step_down(rig.target_nc, STREAM)
    leader = cluster.node(await cluster.leader(rig.target_nc, STREAM))
    await rig.stop_server(leader, kill=True)
    await asyncio.sleep(2.0)
    began = time.monotonic()
    await rig.start_server(leader)
    recover = await rig.time_to_catch_up(began, within=90)
    outcome = await rig.finish("scaled (4 workers): R3 leader stepped down 3 times, then killed", recover_s=recover,
                               ordered=False, faults=STEP_DOWNS + 1,
                               notes=f"{BACKLOG // 4:,} backlog; unordered by design; recover: from the restart")
    assert outcome.duplicated == 0, f"the duplicate window let a copy through twice: {outcome}"


async def test_a_replicated_source_is_copied_to_a_standalone_target(cluster: LocalCluster,
                                                                     target_server: LocalNatsServer,
                                                                     target_nc: Client) -> None:
    """A city's R3 stream copied to a standalone server: the target stream is created with one
    replica (the server refuses more), not refused for ever."""
    nc = await nats.connect(cluster.urls.split(","))
    try:
        await cluster.add_stream(nc, StreamConfig(name=STREAM, subjects=["fleet.>"], num_replicas=3))
        await publish_many(nc, 200, size=64)
        profile = profile_for(topic_config(cluster.urls, target_server.url))
        async with InProcess(profile):
            assert await wait_count(target_nc, STREAM, 200, 30) is not None
        info = await target_nc.jetstream().stream_info(STREAM)
        assert info.config.num_replicas == 1 and info.state.messages == 200
    finally:
        await nc.close()


async def test_target_replicas_gives_r1_cities_an_r3_centre(cluster: LocalCluster, source_server: LocalNatsServer,
                                                              source_nc: Client, target_server: LocalNatsServer,
                                                              target_nc: Client,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """`target_replicas: 3`: a city's R1 stream becomes an R3 stream (with `allow_batched`) on the
    clustered centre. A standalone server cannot have it: an error names the key and nothing is
    created. An existing stream is left as it is, with a warning."""
    caplog.set_level(logging.INFO, logger="replicator")
    await source_nc.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["fleet.>"]))
    await publish_many(source_nc, 300, size=64)
    nc = await nats.connect(cluster.urls.split(","))
    try:
        async with InProcess(profile_for(topic_config(source_server.url, cluster.urls, target_replicas=3))):
            assert await wait_count(nc, STREAM, 300, 30) is not None
        info = await nc.jetstream().stream_info(STREAM)
        assert (info.config.num_replicas, info.config.allow_batched) == (3, True)
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2  # besides the leader

        async with InProcess(profile_for(topic_config(source_server.url, cluster.urls, target_replicas=5))):
            await wait_for_log(caplog, "has 3 replicas, not the 5 of target_replicas")
        assert (await nc.jetstream().stream_info(STREAM)).config.num_replicas == 3
    finally:
        await nc.close()

    async with InProcess(profile_for(topic_config(source_server.url, target_server.url, target_replicas=3))):
        await wait_for_log(caplog, "target_replicas is 3, but the target server is not clustered")
    with pytest.raises(NotFoundError):
        await target_nc.jetstream().stream_info(STREAM)


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str, within: float = 20.0) -> None:
    """Until a captured log line holds `text`."""
    deadline = time.monotonic() + within
    while text not in caplog.text:
        assert time.monotonic() < deadline, f"no log line with {text!r} in {within} s: {caplog.text[-2000:]}"
        await asyncio.sleep(0.05)
