"""What an ordered worker holds while its target does not answer: a window bounded by bytes as well
as by count, and as much again buffered or asked for, read off the source consumer. Large messages
behind a stalled target must not fill a window counted in messages (16,000 on the batch path)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from nats.aio.client import Client

from replicator.copier.endpoints import PUBLISH_TIMEOUT
from replicator.copier.ordered import MAX_BYTES_IN_FLIGHT
from replicator.demo.local_nats import LocalNatsServer
from replicator.transport.jetstream import PULL_BATCH
from tests.copier.helpers import (
    WRITE_PATHS,
    InProcess,
    indices,
    make_stream,
    make_target,
    profile_for,
    publish_many,
    read_all,
    topic_config,
    wait_for_count,
)

SIZE = 16 * 1024
CAPACITY = MAX_BYTES_IN_FLIGHT // SIZE  # the window's byte budget in messages of SIZE (512)


async def delivered_unacked(nc: Client) -> int:
    """Over the source's consumers (none for a moment while a worker re-creates its durable)."""
    return sum(info.num_ack_pending or 0 for info in await nc.jetstream().consumers_info("FLEET"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", WRITE_PATHS)
async def test_a_stalled_target_holds_only_the_byte_budgets(
    path: str, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client, target_nc: Client,
) -> None:
    await make_stream(source_nc)
    await make_target(target_nc, path)
    await publish_many(source_nc, 10, size=SIZE)
    async with InProcess(profile_for(topic_config(source_server.url, target_server.url))):
        assert await wait_for_count(target_nc, "FLEET", 10) == 10
        assert target_server.process is not None
        pid = target_server.process.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await publish_many(source_nc, 3000, start=10, size=SIZE)  # 48 MB, none of it confirmed
            peak = 0
            while True:  # inside the publish timeout, after which the worker starts recovering
                peak = max(peak, await delivered_unacked(source_nc))
                if time.monotonic() - stopped > PUBLISH_TIMEOUT - 1.0:
                    break
                await asyncio.sleep(0.1)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await wait_for_count(target_nc, "FLEET", 3010, timeout=60) == 3010
    # The window (512) and what is buffered behind it (512, asked for in requests of at least
    # PULL_BATCH, 500).
    assert CAPACITY <= peak <= 2 * CAPACITY + PULL_BATCH, peak
    assert indices(await read_all(target_nc, "FLEET")) == list(range(3010))
