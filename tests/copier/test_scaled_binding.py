"""Scaled workers of one process take turns creating the group's durable; what they coordinate
with belongs to their replicator, not to the process: nothing of one event loop's run is handed
to another's (a test suite, or an embedding program, runs many loops in one process)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from replicator.config import Profile
from replicator.copier import scaled
from replicator.demo.local_nats import LocalNatsServer
from replicator.transport.jetstream import Puller
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    topic_config,
    wait_for_count,
    writer_of,
)
from tests.support.faults import StoredMsg, compare, read_stream, wait_acked, wait_count

SCALED = {"workers": 3, "queue_group": "fleet_grp"}


async def _copy_once(source: LocalNatsServer, target: LocalNatsServer, count: int) -> weakref.ref[object]:
    src, tgt = await nats.connect(source.url), await nats.connect(target.url)
    try:
        await publish_many(src, 100, start=count - 100)
        async with InProcess(profile_for(topic_config(source.url, target.url, **SCALED))):
            assert await wait_for_count(tgt, "FLEET", count, 30) == count
    finally:
        await src.close()
        await tgt.close()
    return weakref.ref(asyncio.get_running_loop())


def one_scaled_worker(source: LocalNatsServer, target: LocalNatsServer) -> Profile:
    return profile_for(topic_config(source.url, target.url, workers=1, queued=True, queue_group="fleet_grp"))


async def recreate_behind_the_worker(nc: Client, profile: Profile) -> None:
    """The source stream and the group's durable created again (as another pod would), and 200 new
    messages: sequences 1-200 again, which the old stream's copies also had."""
    js = nc.jetstream()
    await js.delete_stream("FLEET")
    await make_stream(nc)
    await js.add_consumer("FLEET", ConsumerConfig(
        durable_name=profile.group_name, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
        filter_subject="fleet.>", max_ack_pending=20_000, max_waiting=2048))
    await publish_many(nc, 200, start=300)


async def check_each_writer(source_nc: Client, target_nc: Client, old: list[StoredMsg], old_writer: str) -> None:
    """Each stream's messages all on the target, under its own writer id."""
    new_writer = await writer_of(source_nc, "sr")
    target = await read_stream(target_nc, "FLEET")
    for scenario, source, writer in (("old stream", old, old_writer),
                                     ("re-created stream", await read_stream(source_nc, "FLEET"), new_writer)):
        outcome = compare(scenario, source, target, recover_s=None, writer=writer)
        assert outcome.lost == 0 and outcome.mismatched == 0, outcome


def test_scaled_workers_in_one_loop_after_another(source_server: LocalNatsServer,
                                                   target_server: LocalNatsServer) -> None:
    """Three workers bind at once (so they wait for each other) in one loop, then again in a
    second loop once the first is closed: the second run copies, and the first loop is freed."""

    async def prepare() -> None:
        nc = await nats.connect(source_server.url)
        await make_stream(nc)
        await nc.close()

    asyncio.run(prepare())
    first = asyncio.run(_copy_once(source_server, target_server, 100))
    second = asyncio.run(_copy_once(source_server, target_server, 200))
    gc.collect()
    assert first() is None, "a closed event loop is still referenced after its replicator stopped"
    assert second() is None


async def test_a_worker_that_missed_the_re_creation_copies_as_the_new_writer(
    monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    """The source stream is deleted and created again, and the group's durable is created again
    by someone else (another pod), while no status reply reaches this worker (it had no request
    waiting, or the reply was lost). Its next request is served by the new durable: the new
    stream's messages must be copied under the new stream's writer id, or the target would take
    them for duplicates of the old stream's copies with the same sequences and drop them."""
    monkeypatch.setattr(Puller, "_on_status", lambda _self, _msg: None)
    await make_stream(source_nc)
    await publish_many(source_nc, 300)
    profile = one_scaled_worker(source_server, target_server)
    async with InProcess(profile):
        assert await wait_count(target_nc, "FLEET", 300, 30) is not None
        old = await read_stream(source_nc, "FLEET")
        old_writer = await writer_of(source_nc, "sr")
        await recreate_behind_the_worker(source_nc, profile)
        assert await wait_count(target_nc, "FLEET", 500, 30) is not None, "the new stream's copies were dropped"
    await check_each_writer(source_nc, target_nc, old, old_writer)


async def test_a_worker_bound_before_the_re_creation_copies_as_the_new_writer(
    monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    """Another pod copied the old stream; this worker bound to the group's durable after that, and
    the stream and the durable were created again before its first delivery, with no status
    reply reaching it. Its first delivery already comes from the new durable: it has seen no
    delivery of its own to compare, so it compares with the durable's counter at its bind."""
    await make_stream(source_nc)
    await publish_many(source_nc, 300)
    profile = one_scaled_worker(source_server, target_server)
    async with InProcess(profile):  # the other pod
        assert await wait_count(target_nc, "FLEET", 300, 30) is not None
    old = await read_stream(source_nc, "FLEET")
    old_writer = await writer_of(source_nc, "sr")
    monkeypatch.setattr(Puller, "_on_status", lambda _self, _msg: None)
    async with InProcess(profile) as replicator:
        for _ in range(100):  # bound, its requests waiting on the old durable
            if all(w.bound for w in replicator.workers):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        await recreate_behind_the_worker(source_nc, profile)
        assert await wait_count(target_nc, "FLEET", 500, 30) is not None, "the new stream's copies were dropped"
    await check_each_writer(source_nc, target_nc, old, old_writer)


async def test_a_group_durable_deleted_under_running_workers_comes_back_after_its_floor(
    monkeypatch: pytest.MonkeyPatch, source_server: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client,
) -> None:
    """Someone deletes the group's durable (`nats consumer rm`) long after the stream was copied.
    The workers create it again after the ack floor they last read, not at the start position:
    the target's duplicate window (1 s here, 2 minutes by default) has forgotten the old copies,
    so a copy from the start landed every message twice."""
    monkeypatch.setattr(scaled, "GROUP_READ_EVERY", 1.0)
    await make_stream(source_nc)
    await make_stream(target_nc, duplicate_window=1.0)
    await publish_many(source_nc, 300)
    profile = profile_for(topic_config(source_server.url, target_server.url, **SCALED))
    async with InProcess(profile):
        assert await wait_count(target_nc, "FLEET", 300, 30) is not None
        assert await wait_acked(source_nc, "FLEET", profile.group_name, 300, 30) is not None
        await asyncio.sleep(3.0)  # that floor read by the process, the duplicate window gone by
        await source_nc.jetstream().delete_consumer("FLEET", profile.group_name)
        await publish_many(source_nc, 100, start=300)
        assert await wait_count(target_nc, "FLEET", 400, 30) is not None
        await asyncio.sleep(2.0)  # what would be copied again lands by now
        info = await source_nc.jetstream().consumer_info("FLEET", profile.group_name)
    outcome = compare("durable deleted", await read_stream(source_nc, "FLEET"), await read_stream(target_nc, "FLEET"),
                      recover_s=None)
    assert outcome.lost == 0 and outcome.duplicated == 0 and outcome.mismatched == 0, outcome
    assert info.config.opt_start_seq is not None and info.config.opt_start_seq > 1, info.config
