"""Scaled workers of one process take turns creating the group's durable; what they coordinate
with belongs to their replicator, not to the process: nothing of one event loop's run is handed
to another's (a test suite, or an embedding program, runs many loops in one process)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import nats

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import InProcess, make_stream, profile_for, publish_many, topic_config, wait_for_count

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
