"""Fault scenarios under continuous publishing: each ends with a full comparison of target and source.

Each scenario runs the real CLI as child processes, reaching the servers through TCP proxies,
while the test publishes to the source the whole time. The final check (see `Rig.finish`) reads
both streams: nothing lost; in ordered mode nothing duplicated and nothing out of order; payload,
subject and headers byte-exact. Each scenario adds a row (messages, lost, duplicated, time to
recover) to the table printed at the end of the session.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
import yaml
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from replicator.limiter_state import decode_key, limiter_bucket
from replicator.local_nats import free_port
from tests.dataplane.helpers import profile_for, stop
from tests.faults.rig import STREAM, Rig
from tests.support.faults import (
    Outcome,
    log_size,
    metric,
    read_stream,
    scrape,
    stream_count,
    wait_count,
    wait_log,
    wait_metric,
)

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
    rig.target_proxy.set_delay(0.05)  # 100 ms RTT to the target: each worker holds messages in flight
    rig.write_config(workers=2, queue_group="fleet_grp", name=None, monitor=None)
    a = rig.spawn(instance="pod0", log=rig.tmp / "pod0.log")
    rig.spawn(instance="pod1", log=rig.tmp / "pod1.log")
    rig.publish(rate=1000)
    assert await wait_count(rig.target_nc, STREAM, 2000, 30) is not None, rig.log_tail()
    js = rig.source_nc.jetstream()
    killed = time.monotonic()
    rig.kill(a)
    await asyncio.sleep(3)  # publishing continues while the survivor takes the whole load
    assert rig.publisher is not None
    await rig.publisher.stop()
    stuck = (await js.consumer_info(STREAM, "fleet_grp")).num_ack_pending
    # The victim's unacknowledged messages come back after the consumer's ack wait (30 s).
    recover = None
    while time.monotonic() - killed < 60:
        info = await js.consumer_info(STREAM, "fleet_grp")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            recover = time.monotonic() - killed
            break
        await asyncio.sleep(0.5)
    assert recover is not None, f"the group still holds unacknowledged messages: {info}"
    await rig.finish("scaled: 1 of 2 processes killed", recover_s=recover, ordered=False,
                     notes=f"unordered by design; {stuck} held by the victim, redelivered after the "
                           "30 s ack wait; recover: until the group is clean")


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
    deadline = time.monotonic() + 30
    leaders: list[float | None] = [None, None]
    while time.monotonic() < deadline:  # both monitors up, then ten seconds for an election (ttl 3 s)
        leaders = await _leaders(ports, workers)
        if None not in leaders:
            deadline = min(deadline, time.monotonic() + 10)
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


@pytest.mark.timeout(120)
async def test_limiter_kv_unavailable_fails_open_and_resynchronises(rig: Rig) -> None:
    """`limiter_state: kv` with sampling (one copy per host per hour). The KV bucket is deleted
    under load: copying continues (fail open, `limiter_state_errors` counted), and once the store
    has its bucket again it holds every sender copied meanwhile (state resynchronised)."""
    await rig.stream()
    config_path = rig.write_config(inspect="host", age="1h", limiter_state="kv")
    bucket = limiter_bucket(profile_for(yaml.safe_load(config_path.read_text())))
    js = rig.source_nc.jetstream()
    rig.spawn()
    rig.publish(rate=200, make_body=lambda i: json.dumps({"host": f"h{i // 4}", "i": i}).encode())
    if not await _stream_exists(js, f"KV_{bucket}", within=10):
        pytest.xfail("limiter_state 'kv' is not wired into the runner yet: no KV bucket on the source "
                     "(replicator/sampling_wiring.py SamplingPlane.limiter_for returns None)")
    await asyncio.sleep(2)
    await js.delete_stream(f"KV_{bucket}")
    lost_at = time.monotonic()
    copied_before = await stream_count(rig.target_nc, STREAM)
    await asyncio.sleep(4)
    assert await stream_count(rig.target_nc, STREAM) > copied_before, "copying stopped with the KV"
    exposition = await asyncio.to_thread(scrape, rig.monitor)
    errors = metric(exposition, "stream_replicator_limiter_state_errors_total")
    assert errors and errors > 0, "KV failures must be counted in limiter_state_errors"
    hosts_copied: set[str] = set()
    resynced = None
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        hosts_copied = {json.loads(m.data)["host"] for m in await read_stream(rig.target_nc, STREAM)}
        keys = await _kv_keys(rig.source_nc, bucket)
        if hosts_copied <= keys:
            resynced = time.monotonic() - lost_at
            break
        await asyncio.sleep(1)
    missing = sorted(hosts_copied - keys)[:10]
    assert resynced is not None, f"the KV never held the copied senders again: missing {missing}"
    assert rig.publisher is not None
    await rig.publisher.stop()
    await asyncio.sleep(2)
    codes = [stop(p) for p in list(rig.procs)]
    rig.procs.clear()
    source = await read_stream(rig.source_nc, STREAM)
    target = await read_stream(rig.target_nc, STREAM)
    source_hosts = {json.loads(m.data)["host"] for m in source}
    target_hosts = [json.loads(m.data)["host"] for m in target]
    outcome = Outcome("limiter KV bucket deleted (sampling)", len(source), len(target),
                      lost=len(source_hosts - set(target_hosts)),
                      duplicated=len(target_hosts) - len(set(target_hosts)), out_of_order=0, mismatched=0,
                      recover_s=resynced, notes="lost/duplicated per sender; recover: KV resynchronised")
    rig.results.append(outcome)
    assert outcome.lost == 0, outcome
    assert codes == [0] * len(codes)


async def _stream_exists(js: JetStreamContext, name: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await js.stream_info(name)
            return True
        except NotFoundError:
            await asyncio.sleep(0.5)
    return False


async def _kv_keys(nc: Client, bucket: str) -> set[str]:
    try:
        kv = await nc.jetstream().key_value(bucket)
        return {decode_key(k) for k in await kv.keys()}
    except Exception:  # bucket missing or empty
        return set()
