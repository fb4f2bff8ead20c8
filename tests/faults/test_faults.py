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
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.sampling.state.records import decode_key, limiter_bucket
from tests.copier.helpers import WRITE_PATHS, make_target, profile_for, publish_many, stop
from tests.faults.rig import BACKLOG, IN_FLIGHT, STREAM, Rig, copying
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


async def warm_up(rig: Rig, path: str, rate: float = 400.0, **config: object) -> None:
    """Stream, target for the write path, config, one replicator, publishing, and the first
    messages across (a caught-up copier writes single messages per message on either path; the
    catch-up after a fault goes in batches where the target takes them)."""
    await rig.stream()
    await rig.target_for(path)
    rig.write_config(**config)
    rig.spawn()
    rig.publish(rate)
    assert await wait_count(rig.target_nc, STREAM, 300, 30) is not None, rig.log_tail()
    assert await wait_metric(rig.monitor, "stream_replicator_write_path", 1.0, 10, path=path), rig.log_tail()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_kill_9_ten_times_in_a_row(rig: Rig, city2: LocalNatsServer, path: str) -> None:
    """Two cities' replicators (same stream name, same config but the URL) fan into one target and
    are killed at random points (even before they connect), each time both: each resumes from its
    own newest copy among the other's: no gap, no duplicate, in order, across ten crashes."""
    rng = random.Random(20240607)
    await rig.add_city(city2)
    await rig.stream()
    await rig.target_for(path)
    rig.write_config()
    rig.publish()
    for _ in range(10):
        procs = [rig.spawn(), rig.spawn(city=True)]
        await asyncio.sleep(rng.uniform(0.4, 2.5))
        for proc in rng.sample(procs, 2):
            rig.kill(proc)
    began = time.monotonic()
    rig.spawn()
    rig.spawn(city=True)
    recover = await rig.time_to_catch_up(began)
    await rig.finish(f"kill -9 of the workers, 10 times (ordered, 2 sources -> 1 target; {path} path)",
                     recover_s=recover,
                     faults=10, notes="recover: from the last restart")


async def backlog(rig: Rig, path: str) -> None:
    """A target for the write path, a backlog on the source, continuous publishing on top."""
    await rig.stream()
    await make_target(rig.target_nc, path, STREAM)
    await publish_many(rig.source_nc, BACKLOG, size=64)
    rig.target_proxy.set_delay(0.01)
    rig.write_config(max_in_flight=IN_FLIGHT[path])
    rig.publish()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_kill_9_in_the_middle_of_a_batch(rig: Rig, path: str) -> None:
    """A backlog copied in fast-ingest batches (or per message); the worker is killed three times
    in the middle of it. The server keeps what a dead writer's batch delivered; the next worker
    finds its newest copy on the target and goes on: nothing lost, duplicated or reordered."""
    rng = random.Random(20261124)
    await backlog(rig, path)
    for i in range(3):
        proc = rig.spawn()
        await copying(rig, path, (i + 1) * BACKLOG // 5)
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        rig.kill(proc)
        assert await stream_count(rig.target_nc, STREAM) < BACKLOG, "the backlog was copied before the kill"
    began = time.monotonic()
    rig.spawn()
    recover = await rig.time_to_catch_up(began, within=90)
    await rig.finish(f"kill -9 in the middle of a batch, 3 times ({path} path)", recover_s=recover, faults=3,
                     notes=f"{BACKLOG:,} backlog; recover: from the last restart, backlog included", within=120)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_target_restart_in_the_middle_of_a_batch(rig: Rig, path: str) -> None:
    """The target server is killed (SIGKILL) and started again while a backlog is copied: the batch
    dies with it (10208, or a timeout); the worker learns from the target what landed and carries on."""
    await backlog(rig, path)
    rig.spawn()
    await copying(rig, path, BACKLOG // 4)
    await rig.stop_server(rig.target, kill=True)
    assert await stream_count(rig.source_nc, STREAM) > 0  # (the target's count is gone with it)
    await asyncio.sleep(2.0)
    began = time.monotonic()
    await rig.start_server(rig.target)
    recover = await rig.time_to_catch_up(began, within=90)
    await rig.finish(f"target killed and restarted in the middle of a batch ({path} path)", recover_s=recover,
                     notes=f"{BACKLOG:,} backlog; recover: from the restart, backlog included", within=120)


SERVER_DOWN_NOTES = {"target": "recover: from the restart", "source": "publishing retried during the outage"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", WRITE_PATHS)
@pytest.mark.parametrize("side", ["target", "source"])
async def test_server_down_for_10s(rig: Rig, side: str, path: str) -> None:
    server = rig.target if side == "target" else rig.source
    await warm_up(rig, path)
    await rig.stop_server(server)
    await asyncio.sleep(OUTAGE)
    began = time.monotonic()
    await rig.start_server(server)
    recover = await rig.time_to_catch_up(began)
    await rig.finish(f"{side} server stopped 10 s ({path} path)", recover_s=recover, notes=SERVER_DOWN_NOTES[side])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", WRITE_PATHS)
@pytest.mark.parametrize("side", ["source", "target"])
async def test_link_cut_for_10s(rig: Rig, side: str, path: str) -> None:
    """The proxy closes the replicator's connections and refuses new ones; 20 ms latency otherwise."""
    proxy = rig.source_proxy if side == "source" else rig.target_proxy
    for p in (rig.source_proxy, rig.target_proxy):
        p.set_delay(0.01)
    await warm_up(rig, path)
    proxy.cut()
    await asyncio.sleep(OUTAGE)
    proxy.restore()
    recover = await rig.time_to_catch_up(time.monotonic())
    await rig.finish(f"{side} link cut 10 s (20 ms RTT; {path} path)", recover_s=recover)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_half_open_links_detected_by_pings(rig: Rig, path: str) -> None:
    """Both links go silent without closing: only pings (every 5 s, 3 unanswered) can tell. The
    replicator must notice on its own well before the link comes back, not wait it out forever."""
    await warm_up(rig, path)
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
    await rig.finish(f"half-open links, both sides ({path} path)", recover_s=recover,
                     notes=f"detected by pings after {detected:.0f} s")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_target_stream_full_backs_off_alerts_and_resumes(rig: Rig, path: str) -> None:
    """`max_msgs` with discard new: the replicator backs off, says so in the target_blocked gauge
    (scraped over HTTP) and the log, and once the limit is raised copies the rest, nothing lost.
    On the batch path the stream fills in the middle of a batch (an error frame ends it)."""
    limit = 1500
    await rig.stream()
    js = rig.target_nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["fleet.>"], max_msgs=limit,
                                     discard=DiscardPolicy.NEW, allow_batched=True if path == "batch" else None))
    if path == "batch":
        await publish_many(rig.source_nc, 2 * limit, size=64)  # a backlog: the limit is hit inside a batch
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
    await rig.finish(f"target stream full (max_msgs, discard new; {path} path)", recover_s=recover,
                     notes=f"blocked gauge 1, {failed:.0f} failed attempts; recover: from raising max_msgs")


@pytest.mark.timeout(150)
async def test_scaled_one_of_two_processes_killed(rig: Rig, city2: LocalNatsServer) -> None:
    """Two processes share the group's durable; one dies mid-stream. Its unacknowledged messages
    come back after the consumer's ack wait (30 s) and the survivor copies them: nothing lost, and
    the target's duplicate window drops the copies that had landed. A second city's group writes
    into the same target meanwhile."""
    await rig.add_city(city2)
    await rig.stream()
    rig.target_proxy.set_delay(0.05)  # 100 ms RTT to the target: each worker holds messages in flight
    rig.write_config(workers=2, queue_group="fleet_grp", name=None, monitor=None)
    a = rig.spawn(instance="pod0", log=rig.tmp / "pod0.log")
    rig.spawn(instance="pod1", log=rig.tmp / "pod1.log")
    rig.spawn(instance="city2", city=True)
    rig.publish(rate=1000)
    assert await wait_count(rig.target_nc, STREAM, 4000, 30) is not None, rig.log_tail()
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
    outcome = await rig.finish("scaled: 1 of 2 processes killed (2 sources -> 1 target)", recover_s=recover,
                               ordered=False, notes=f"unordered by design; {stuck} held by the victim, redelivered "
                                                    "after the 30 s ack wait; recover: until the group is clean")
    assert outcome.duplicated == 0, f"the duplicate window let a redelivered copy through: {outcome}"


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
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_leader_election_leader_killed_under_load(rig: Rig, city2: LocalNatsServer, path: str) -> None:
    """Ordered hot standby: two processes, one copies. Killing the leader under load hands over to
    the standby within the election TTL, with nothing lost, duplicated or reordered, while a second
    city's replicator writes into the same target."""
    await rig.add_city(city2)
    await rig.stream()
    await rig.target_for(path)
    rig.write_config(leader_election=True, leader_election_ttl="3s", monitor=None)
    rig.spawn(instance="city2", city=True)
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
    assert sorted(v or 0 for v in leaders) == [0.0, 1.0], f"leaders {leaders}\n{rig.log_tail()}"
    assert await wait_count(rig.target_nc, STREAM, 1000, 30) is not None
    leader = procs[leaders.index(1.0)]
    rig.kill(leader)
    recover = await rig.time_to_catch_up(time.monotonic(), within=60)
    await rig.finish(f"leader election: leader killed under load (2 sources -> 1 target; {path} path)",
                     recover_s=recover,
                     notes="ttl 3 s; recover: from the kill")


KV_ALLOW = 'authorization {{ users = [ {{ user: "sr", password: "kv-pw" }} ] }}'
KV_DENY = ('authorization {{ users = [ {{ user: "sr", password: "kv-pw", '
           'permissions: {{ publish: {{ deny: ["$KV.{bucket}.>"] }} }} }} ] }}')


def _reload(server: LocalNatsServer, extra: str) -> None:
    """Change the server's config and reload it live (SIGHUP): connections stay, permissions change."""
    assert server.process is not None and server.store_dir is not None
    server.extra_config = extra
    (server.store_dir / "server.conf").write_text(server.config_text())
    server.process.send_signal(signal.SIGHUP)


@pytest.mark.timeout(120)
async def test_limiter_kv_unavailable_fails_open_and_resynchronises(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client, fault_results: list[Outcome],
) -> None:
    """`limiter_state: kv` with sampling (one copy per host per hour), new hosts all the time.
    Phase 1: writes to the KV bucket are refused for 6 s (permissions revoked by a live reload):
    copying continues (fail open, `limiter_state_errors` counted) and once writes work again the
    KV holds every sender copied meanwhile. Phase 2: the bucket is deleted; the store must create
    it again and write its state back."""
    source = LocalNatsServer(name="kv-source", store_dir=tmp_path_factory.mktemp("kv-source"),
                             extra_config=KV_ALLOW.format()).start()
    rig = await Rig(tmp_path, source, target_server, source_nc, target_nc, fault_results,
                    userinfo="sr:kv-pw@").open()
    try:
        await _kv_scenario(rig, source)
    finally:
        await rig.close()
        source.close()


async def _kv_scenario(rig: Rig, source: LocalNatsServer) -> None:
    await rig.stream()
    config_path = rig.write_config(inspect="host", age="1h", limiter_state="kv")
    bucket = limiter_bucket(profile_for(yaml.safe_load(config_path.read_text())))
    js = rig.source_nc.jetstream()
    rig.spawn()
    rig.publish(rate=200, make_body=lambda i: json.dumps({"host": f"h{i // 4}", "i": i}).encode())
    assert await _stream_exists(js, f"KV_{bucket}", within=10), f"no KV bucket on the source\n{rig.log_tail()}"
    await asyncio.sleep(2)

    # Phase 1: the KV refuses writes for a while.
    _reload(source, KV_DENY.format(bucket=bucket))
    copied_before = await stream_count(rig.target_nc, STREAM)
    await asyncio.sleep(6)
    assert await stream_count(rig.target_nc, STREAM) > copied_before + 100, "copying stopped with the KV"
    exposition = await asyncio.to_thread(scrape, rig.monitor)
    errors = metric(exposition, "stream_replicator_limiter_state_errors_total")
    assert errors and errors > 0, "KV failures must be counted in limiter_state_errors"
    restored = time.monotonic()
    _reload(source, KV_ALLOW.format())
    resynced = await _kv_holds_copied_senders(rig, bucket, within=30)
    missing = sorted(_copied_hosts(await read_stream(rig.target_nc, STREAM)) - await _kv_keys(rig.source_nc, bucket))
    assert resynced, f"the KV never held the senders copied while it refused writes: {missing[:10]}"
    resync_s = time.monotonic() - restored

    # Phase 2: the bucket is deleted under load.
    await js.delete_stream(f"KV_{bucket}")
    recreated = await _kv_holds_copied_senders(rig, bucket, within=12)

    assert rig.publisher is not None
    await rig.publisher.stop()
    await asyncio.sleep(2)
    codes = [stop(p) for p in list(rig.procs)]
    rig.procs.clear()
    source_msgs = await read_stream(rig.source_nc, STREAM)
    target_msgs = await read_stream(rig.target_nc, STREAM)
    source_hosts = _copied_hosts(source_msgs)
    target_hosts = [json.loads(m.data)["host"] for m in target_msgs]
    outcome = Outcome("limiter KV refused writes 6 s (sampling)", len(source_msgs), len(target_msgs),
                      lost=len(source_hosts - set(target_hosts)),
                      duplicated=len(target_hosts) - len(set(target_hosts)), out_of_order=0, mismatched=0,
                      recover_s=resync_s, faults=2,
                      notes=f"{errors:.0f} state errors; lost/duplicated per sender; recover: KV resynchronised; "
                            f"bucket deleted: {'re-created with the state' if recreated else 'NOT re-created'}")
    rig.results.append(outcome)
    assert outcome.lost == 0, outcome
    assert codes == [0] * len(codes)
    assert recreated, "after the bucket was deleted, the store never created it again with its state"


def _copied_hosts(msgs: list[Any]) -> set[str]:
    return {json.loads(m.data)["host"] for m in msgs}


async def _kv_holds_copied_senders(rig: Rig, bucket: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        hosts = _copied_hosts(await read_stream(rig.target_nc, STREAM))
        if hosts and hosts <= await _kv_keys(rig.source_nc, bucket):
            return True
        await asyncio.sleep(1)
    return False


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
