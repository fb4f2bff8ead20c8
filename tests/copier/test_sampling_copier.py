"""Sampling through the real copier and processes: skips acked, copies exact, KV shared, leader failover."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from nats.js.api import DiscardPolicy

from tests.copier.helpers import (
    WRITE_PATHS,
    InProcess,
    indices,
    make_stream,
    make_target,
    profile_for,
    read_all,
    source_seqs,
    spawn,
    stop,
    topic_config,
    wait_for_count,
    write_config,
)
from tests.support.faults import acked_upto, wait_acked


async def publish_rounds(nc, senders: int, rounds: int, pause: float = 0.0, start: int = 0) -> int:
    js = nc.jetstream()
    n = start
    for r in range(rounds):
        futures = []
        for s in range(senders):
            body = json.dumps({"sender": f"node{s}", "i": n, "round": r}).encode()
            futures.append(await js.publish_async(f"fleet.reg.node{s}", body))
            n += 1
        await asyncio.gather(*futures)
        if pause:
            await asyncio.sleep(pause)
    return n


async def test_ordered_sampling_copies_each_sender_once_per_age(source_server, target_server, source_nc,
                                                                 target_nc):
    await make_stream(source_nc)
    await publish_rounds(source_nc, 200, 5)
    profile = profile_for(topic_config(source_server.url, target_server.url, inspect="sender", age="1h"))
    async with InProcess(profile) as replicator:
        assert await wait_for_count(target_nc, "FLEET", 200) == 200
        await asyncio.sleep(1.0)
        info = await source_nc.jetstream().consumer_info("FLEET", "sr")
        assert info.ack_floor.stream_seq == 1000 and info.num_pending == 0
        reg = replicator.metrics.registry
        labels = {"name": "sr", "worker": "sr_0"}
        assert reg.get_sample_value("stream_replicator_limiter_memory_skipped_total", labels) == 800
        assert reg.get_sample_value("stream_replicator_limiter_memory_passed_total", labels) == 200
        assert reg.get_sample_value("stream_replicator_limiter_memory_seen", labels) == 200
    msgs = await read_all(target_nc, "FLEET")
    senders = Counter(json.loads(m.data)["sender"] for m in msgs)
    assert len(senders) == 200 and set(senders.values()) == {1}
    assert [json.loads(m.data)["round"] for m in msgs] == [0] * 200



@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("state", ["memory", "kv"])
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_kill_9_of_a_sampling_copier_loses_duplicates_and_reorders_nothing(
        tmp_path, source_server, target_server, source_nc, target_nc, path, state):
    """A sampled backlog (every sender five times, so runs of skips between copies) is copied by
    workers killed with SIGKILL as the source's ack floor passes 15%, 35%, 55% and 75%, on both
    write paths: everything ends acknowledged, every sender has a copy on the target (a restarted
    worker forgets the senders it saw, so some have two, from different source messages), no source
    message is copied twice and the copies are in source order."""
    senders, rounds = 20_000, 5
    await make_stream(source_nc)
    await make_target(target_nc, path)
    total = await publish_rounds(source_nc, senders, rounds)
    config = write_config(tmp_path / "sr.yaml", topic_config(source_server.url, target_server.url,
                                                             inspect="sender", age="1h",
                                                             limiter_state=state))
    log = tmp_path / "worker.log"
    for share in (0.15, 0.35, 0.55, 0.75):
        proc = spawn(config, log_path=log)
        try:
            for _ in range(1200):
                if await acked_upto(source_nc, "FLEET", "sr") >= share * total or proc.poll() is not None:
                    break
                await asyncio.sleep(0.02)
        finally:
            stop(proc, kill=True)
    logged = log.stat().st_size if log.exists() else 0
    proc = spawn(config, log_path=log)
    try:
        # Until it is up, too: the last kill can land after the killed worker acked everything,
        # and a SIGTERM before the process has its handlers ends it with -15, not a clean stop.
        for _ in range(1500):
            if await acked_upto(source_nc, "FLEET", "sr") >= total and b"bound to" in log.read_bytes()[logged:]:
                break
            await asyncio.sleep(0.04)
        assert await acked_upto(source_nc, "FLEET", "sr") == total, log.read_text()[-3000:]
    finally:
        assert stop(proc) == 0
    msgs = await read_all(target_nc, "FLEET")
    copied = Counter(json.loads(m.data)["sender"] for m in msgs)
    assert len(copied) == senders, f"{senders - len(copied)} senders were skipped without a copy"
    seqs = source_seqs(msgs)
    assert seqs == sorted(set(seqs)), "a source message was copied twice, or out of order"


@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_copies_refused_by_a_full_target_land_once_it_has_room(source_server, target_server, source_nc,
                                                                    target_nc, mode):
    """A target that refuses copies (full, discard new) makes them fail after the limiter recorded
    its senders as copied: the scaled copier naks them and samples the redeliveries again, the
    ordered one retries its window. Either way, once the target has room every sender lands."""
    senders = 200
    await make_stream(source_nc)
    await make_target(target_nc, "message", max_msgs=50, discard=DiscardPolicy.NEW)
    scaled = {"name": None, "workers": 2, "queue_group": "fleet_grp"} if mode == "scaled" else {}
    profile = profile_for(topic_config(source_server.url, target_server.url, inspect="sender", age="1h",
                                       **scaled))
    async with InProcess(profile):
        await publish_rounds(source_nc, senders, 3)
        assert await wait_for_count(target_nc, "FLEET", 50) == 50
        await asyncio.sleep(2.0)  # refused copies meet the full target again and again
        info = await target_nc.jetstream().stream_info("FLEET")
        info.config.max_msgs = -1
        await target_nc.jetstream().update_stream(info.config)
        await wait_for_count(target_nc, "FLEET", senders, timeout=30)
        await asyncio.sleep(1.0)
    msgs = await read_all(target_nc, "FLEET")
    copied = Counter(json.loads(m.data)["sender"] for m in msgs)
    assert len(copied) == senders, f"{senders - len(copied)} senders were skipped without a copy"
    assert set(copied.values()) == {1}, copied.most_common(3)


@pytest.mark.slow
async def test_two_scaled_processes_on_kv_state_never_double_forward(tmp_path, source_server, target_server,
                                                                      source_nc, target_nc):
    await make_stream(source_nc)
    config = write_config(tmp_path / "sr.yaml", topic_config(
        source_server.url, target_server.url, name=None, workers=3, queue_group="fleet_grp",
        inspect="sender", age="30s", limiter_state="kv"))
    procs = [spawn(config, instance=f"pod{i}", log_path=tmp_path / f"w{i}.log") for i in range(2)]
    try:
        await asyncio.sleep(2.0)
        total = await publish_rounds(source_nc, 300, 6, pause=0.2)
        assert await wait_for_count(target_nc, "FLEET", 300, timeout=30) >= 300
        await asyncio.sleep(2.0)
        info = await source_nc.jetstream().consumer_info("FLEET", "fleet_grp")
        assert info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        for proc in procs:
            assert stop(proc) == 0
    msgs = await read_all(target_nc, "FLEET")
    senders = Counter(json.loads(m.data)["sender"] for m in msgs)
    assert len(senders) == 300 and max(senders.values()) == 1, senders.most_common(3)
    assert total == 1800


@pytest.mark.slow
async def test_leader_failover_under_load_loses_and_duplicates_nothing(tmp_path, source_server, target_server,
                                                                        source_nc, target_nc):
    await make_stream(source_nc)
    config = write_config(tmp_path / "sr.yaml", topic_config(
        source_server.url, target_server.url, leader_election=True, leader_election_ttl="2s"))
    procs = [spawn(config, instance=f"pod{i}", log_path=tmp_path / f"w{i}.log") for i in range(2)]
    try:
        await asyncio.sleep(3.0)
        from tests.copier.helpers import publish_many

        publisher = asyncio.ensure_future(publish_many(source_nc, 20_000, size=64))
        await asyncio.sleep(0.8)
        kv = await source_nc.jetstream().key_value("SR_ELECTION_2000MS")
        entry = await kv.get("sr")
        leader_instance = entry.value.decode().split(":")[-1]
        victim = procs[int(leader_instance.removeprefix("pod"))]
        stop(victim, kill=True)
        await publisher
        assert await wait_for_count(target_nc, "FLEET", 20_000, timeout=60) == 20_000
        await asyncio.sleep(1.0)
    finally:
        for proc in procs:
            if proc.poll() is None:
                assert stop(proc) == 0
    assert indices(await read_all(target_nc, "FLEET")) == list(range(20_000))


async def test_ordered_kv_sampling_claims_ahead_and_still_copies_each_sender_s_first_message(
        source_server, target_server, source_nc, target_nc):
    """A backlog of new senders on KV state: the claims of the deliveries behind a new sender go
    out together, yet each sender is copied once, by its first message, in the stream's order,
    and every decision is counted once."""
    await make_stream(source_nc)
    await publish_rounds(source_nc, 1500, 3)
    profile = profile_for(topic_config(source_server.url, target_server.url, inspect="sender", age="1h",
                                       limiter_state="kv"))
    async with InProcess(profile) as replicator:
        assert await wait_for_count(target_nc, "FLEET", 1500) == 1500
        assert await wait_acked(source_nc, "FLEET", "sr", 4500, 30) is not None
        reg = replicator.metrics.registry
        labels = {"name": "sr", "worker": "sr_0"}
        assert reg.get_sample_value("stream_replicator_limiter_memory_passed_total", labels) == 1500
        assert reg.get_sample_value("stream_replicator_limiter_memory_skipped_total", labels) == 3000
    msgs = await read_all(target_nc, "FLEET")
    assert [json.loads(m.data)["i"] for m in msgs] == list(range(1500))  # round 0, in order
    assert source_seqs(msgs) == list(range(1, 1501))


@pytest.mark.slow
async def test_two_processes_claiming_a_cold_backlog_together_copy_each_sender_once(
        tmp_path, source_server, target_server, source_nc, target_nc):
    """Cold start across two pods on KV state: a preloaded backlog of new senders, each seen three
    times; claims go out in groups from both pods at once; each sender is copied exactly once,
    and its `new` advisory published exactly once."""
    await make_stream(source_nc)
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.adv.>"])
    total = await publish_rounds(source_nc, 3000, 3)
    config = write_config(tmp_path / "sr.yaml", topic_config(
        source_server.url, target_server.url, name=None, workers=2, queue_group="fleet_grp",
        inspect="sender", age="1h", limiter_state="kv", advisory={"target": "sr.adv.fleet"}))
    procs = [spawn(config, instance=f"pod{i}", log_path=tmp_path / f"w{i}.log") for i in range(2)]
    try:
        assert await wait_acked(source_nc, "FLEET", "fleet_grp", total, 90) is not None
        assert await wait_for_count(target_nc, "ADV", 3000, timeout=60) >= 3000
        await asyncio.sleep(1.0)  # anything extra would show up now
    finally:
        for proc in procs:
            assert stop(proc) == 0
    senders = Counter(json.loads(m.data)["sender"] for m in await read_all(target_nc, "FLEET"))
    assert len(senders) == 3000 and max(senders.values()) == 1, senders.most_common(3)
    advised = Counter(json.loads(m.data)["value"] for m in await read_all(target_nc, "ADV"))
    assert len(advised) == 3000 and max(advised.values()) == 1, advised.most_common(3)
    assert {json.loads(m.data)["event"] for m in await read_all(target_nc, "ADV")} == {"new"}
