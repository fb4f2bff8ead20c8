"""How ordered mode writes to the target: fast-ingest batches where the target stream allows them,
else per message; and the switch at runtime when a target stops taking batches."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.client import Client

from replicator.copier.durable import WRITE_NOTE
from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import (
    InProcess,
    make_stream,
    make_target,
    profile_for,
    publish_many,
    topic_config,
    write_path,
)
from tests.support.faults import compare, read_stream, wait_count


@pytest.mark.timeout(90)
async def test_a_target_that_stops_taking_batches_is_written_per_message(
    source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client, target_nc: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`allow_batched` switched off on the target in the middle of a batch: the server drops the
    batch and refuses the rest of it (10205); the copier learns from the target what landed, goes
    on per message, says so (log, metric, the durable's note for `report`), and the copy is
    complete, once each and in order."""
    caplog.set_level(logging.INFO, logger="replicator")
    await make_stream(source_nc)
    await make_target(target_nc, "batch")
    await publish_many(source_nc, 20_000)
    js = target_nc.jetstream()
    async with InProcess(profile_for(topic_config(source_server.url, target_server.url))) as replicator:
        assert await wait_count(target_nc, "FLEET", 2_000, 30) is not None
        assert write_path(replicator) == "batch"
        config = (await js.stream_info("FLEET")).config
        config.allow_batched = False
        await js.update_stream(config)
        await publish_many(source_nc, 500, start=20_000)
        assert await wait_count(target_nc, "FLEET", 20_500, 60) is not None, "copies were lost"
        await asyncio.sleep(0.5)
        assert write_path(replicator) == "message"
        note = (await source_nc.jetstream().consumer_info("FLEET", "sr")).config.metadata or {}
        assert note.get(WRITE_NOTE) == "message"
    assert any("does not take fast-ingest batches" in r.getMessage() for r in caplog.records)
    outcome = compare("batches switched off", await read_stream(source_nc, "FLEET"),
                      await read_stream(target_nc, "FLEET"), recover_s=None)
    assert (outcome.lost, outcome.duplicated, outcome.out_of_order, outcome.mismatched) == (0, 0, 0, 0), outcome
