from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

import pytest

from replicator.copier.provenance import stream_identity, writer_id
from tests.copier.helpers import (
    WRITE_PATHS,
    InProcess,
    indices,
    make_stream,
    make_target,
    profile_for,
    publish_many,
    read_all,
    source_seqs,
    topic_config,
    wait_for_count,
    write_path,
)


@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_ordered_copies_everything_in_order(path, source_server, target_server, source_nc, target_nc, caplog):
    """On both write paths, chosen from the target stream: `allow_batched` gets fast-ingest
    batches, a target without it one publish per message (logged, and in the metric label)."""
    caplog.set_level(logging.DEBUG, logger="replicator.copier")
    await make_stream(source_nc)
    await make_target(target_nc, path)
    await publish_many(source_nc, 12_000)
    profile = profile_for(topic_config(source_server.url, target_server.url))
    async with InProcess(profile) as replicator:
        assert await wait_for_count(target_nc, "FLEET", 12_000) == 12_000
        assert write_path(replicator) == path
    msgs = await read_all(target_nc, "FLEET")
    assert indices(msgs) == list(range(12_000))
    assert source_seqs(msgs) == list(range(1, 12_001))
    said = {"batch": "in fast-ingest batches", "message": "per message (it does not allow batched publishing)"}
    assert any(said[path] in r.getMessage() for r in caplog.records)
    batches = [r for r in caplog.records if r.getMessage().endswith(")") and "opened (flow" in r.getMessage()]
    assert bool(batches) == (path == "batch")


async def test_headers_preserved_provenance_and_msg_id(source_server, target_server, source_nc, target_nc):
    """Original headers kept; the publisher's own Nats-Msg-Id kept renamed; the copy's Nats-Msg-Id and
    provenance name this writer: the source stream instance (nats-server's identity) and the name."""
    await make_stream(source_nc)
    js = source_nc.jetstream()
    await js.publish("fleet.a", b"one", headers={"X-Site": "ams", "Content-Type": "application/json"})
    await js.publish("fleet.b", b"two", headers={"Nats-Msg-Id": "mine-1"})
    profile = profile_for(topic_config(source_server.url, target_server.url, name="edge"))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 2) == 2
    first, second = await read_all(target_nc, "FLEET")
    assert first.data == b"one" and first.headers["X-Site"] == "ams"
    assert first.headers["Content-Type"] == "application/json"
    created = json.loads((await source_nc.request("$JS.API.STREAM.INFO.FLEET", b"")).data)["created"]
    writer = writer_id("FLEET", stream_identity(created), "edge")
    assert first.headers["Nats-Msg-Id"] == f"{writer}:1" and second.headers["Nats-Msg-Id"] == f"{writer}:2"
    stream, seq, name, ts, by, instance = first.headers["Stream-Replicator-Source"].split(" ")
    assert (stream, seq, name, by) == ("FLEET", "1", "edge", writer) and int(ts) > 1_600_000_000_000
    assert instance == stream_identity(created)  # the place the copy came from (the loop guard reads it)
    assert second.headers["Stream-Replicator-Orig-Nats-Msg-Id"] == "mine-1"


async def test_subject_rewrite_and_target_created_from_source(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc, subjects=["fleet.>"], max_msgs_per_subject=50)
    await publish_many(source_nc, 300)
    profile = profile_for(topic_config(source_server.url, target_server.url, target_stream="CENTRE",
                                       target_subject_prefix="dc1", target_subject_remove="fleet."))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "CENTRE", 300) == 300
    info = await target_nc.jetstream().stream_info("CENTRE")
    assert info.config.subjects == ["dc1.>"]
    assert info.config.max_msgs_per_subject == -1  # a limit sized for one source is not taken (fan-in)
    msgs = await read_all(target_nc, "CENTRE")
    assert {m.subject for m in msgs} == {f"dc1.n{i}" for i in range(100)}


async def test_target_create_false_waits_for_the_stream(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 10)
    profile = profile_for(topic_config(source_server.url, target_server.url, target_create=False))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 1, timeout=1.5) == -1
        await make_stream(target_nc, storage="memory")
        assert await wait_for_count(target_nc, "FLEET", 10) == 10


@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_restart_resumes_without_duplicates(path, source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await make_target(target_nc, path)
    await publish_many(source_nc, 3000)
    profile = profile_for(topic_config(source_server.url, target_server.url))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 3000) == 3000
    await publish_many(source_nc, 2000, start=3000)
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 5000) == 5000
        await asyncio.sleep(0.5)
    msgs = await read_all(target_nc, "FLEET")
    assert indices(msgs) == list(range(5000))


async def test_start_positions_apply_on_first_start_only(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 100)
    profile = profile_for(topic_config(source_server.url, target_server.url, start_sequence=61))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 40) == 40
    await publish_many(source_nc, 10, start=100)
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 50) == 50
    assert indices(await read_all(target_nc, "FLEET")) == list(range(60, 110))


async def test_start_at_end_and_max_age(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 20)
    profile = profile_for(topic_config(source_server.url, target_server.url, start_at_end=True))
    async with InProcess(profile) as replicator:
        await asyncio.sleep(1.0)
        await publish_many(source_nc, 5, start=20)
        assert await wait_for_count(target_nc, "FLEET", 5) == 5
        assert replicator.workers[0].ready
    assert indices(await read_all(target_nc, "FLEET")) == list(range(20, 25))


async def test_max_age_skips_old_messages(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 30)
    await asyncio.sleep(2.2)
    await publish_many(source_nc, 5, start=30)
    profile = profile_for(topic_config(source_server.url, target_server.url, max_age="2s"))
    async with InProcess(profile) as replicator:
        assert await wait_for_count(target_nc, "FLEET", 5) == 5
        await asyncio.sleep(0.3)
        metrics = replicator.metrics.registry
        assert metrics.get_sample_value("stream_replicator_too_old_msgs_total",
                                        {"name": "sr", "worker": "sr_0"}) == 30
    assert indices(await read_all(target_nc, "FLEET")) == list(range(30, 35))
    info = await source_nc.jetstream().consumer_info("FLEET", "sr")
    assert info.ack_floor.stream_seq == 35


@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_resume_after_skips_what_another_engine_copied(mode, source_server, target_server, source_nc,
                                                             target_nc):
    """The operator's engine switch: the native engine copied up to 70 while this replicator was
    away (its durable still at 30); with `resume_after: 70` it goes on at 71, nothing twice."""
    await make_stream(source_nc)
    await publish_many(source_nc, 30)
    extra = {"queued": True, "workers": 2} if mode == "scaled" else {}
    profile = profile_for(topic_config(source_server.url, target_server.url, **extra))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 30) == 30
    await publish_many(source_nc, 70, start=30)
    handed_over = profile_for(topic_config(source_server.url, target_server.url, resume_after=70, **extra))
    async with InProcess(handed_over):
        assert await wait_for_count(target_nc, "FLEET", 60) == 60
        await asyncio.sleep(0.5)
    assert sorted(indices(await read_all(target_nc, "FLEET"))) == [*range(30), *range(70, 100)]


async def test_a_large_message_backlog_never_overruns_the_source(source_server, target_server, source_nc, target_nc):
    """16 KB messages, a backlog (80 MB) larger than what the source server buffers for one client
    (64 MB): copied whole, once and in order, and the server never cut the copier off as a slow
    consumer (the pulls are sized by bytes, the first one for large messages)."""
    count = 5_000
    await make_stream(source_nc)
    await make_target(target_nc, "batch")
    await publish_many(source_nc, count, size=16 * 1024)
    profile = profile_for(topic_config(source_server.url, target_server.url))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", count, timeout=120.0) == count
    varz = await asyncio.to_thread(_varz, source_server.monitor_port)
    assert varz["slow_consumers"] == 0
    assert source_seqs(await read_all(target_nc, "FLEET")) == list(range(1, count + 1))


def _varz(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=10) as reply:
        return json.loads(reply.read())
