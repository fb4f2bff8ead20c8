"""A target stream the replicator creates is safe for fan-in: two cities whose streams keep 300
messages each fan into a region stream the first city's replicator creates, and the region keeps
both cities' messages (it took neither city's count or size limits). The `target_*` keys set the
region's own limits; an existing region tighter than a city is warned about."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StorageType

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import InProcess, make_stream, profile_for, publish_many, topic_config
from tests.support.faults import stream_count, wait_count

CITY = {"max_msgs": 300, "max_bytes": 1 << 20, "max_msgs_per_subject": 200, "max_age": 3600.0}


@pytest.fixture
def city2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    server = LocalNatsServer(name="city2", store_dir=tmp_path_factory.mktemp("city2-js")).start()
    yield server
    server.close()


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str, within: float = 20.0) -> str:
    for _ in range(int(within * 10)):
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no log line with {text!r}")


@pytest.mark.timeout(120)
async def test_two_cities_with_max_msgs_fan_into_a_region_the_replicator_creates(
    source_server: LocalNatsServer, city2: LocalNatsServer, target_server: LocalNatsServer,
    source_nc: Client, target_nc: Client, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="replicator")
    nc2 = await nats.connect(city2.url)
    try:
        for city, nc in (("c1", source_nc), ("c2", nc2)):
            await make_stream(nc, **CITY)
            await publish_many(nc, 300, subject=f"fleet.{city}.n{{i}}")
        first = profile_for(topic_config(source_server.url, target_server.url, name="city1"))
        async with InProcess(first):
            assert await wait_count(target_nc, "FLEET", 300, 30) is not None
            line = await wait_for_log(caplog, "created target stream FLEET")
        assert "took the source's storage file, retention limits and max_age 3600s" in line, line
        assert ("not the source's max_msgs 300, max_bytes 1048576, max_msgs_per_subject 200, sized for one source"
                in line), line
        config = (await target_nc.jetstream().stream_info("FLEET")).config
        assert (config.max_msgs, config.max_bytes, config.max_msgs_per_subject) == (-1, -1, -1)
        assert config.max_age == 3600.0 and config.storage == StorageType.FILE
        second = profile_for(topic_config(city2.url, target_server.url, name="city2"))
        async with InProcess(second):
            assert await wait_count(target_nc, "FLEET", 600, 30) is not None
            await asyncio.sleep(1.0)
        # Nothing discarded from the region because of a city's limits: 600 held, the first city's too.
        assert await stream_count(target_nc, "FLEET") == 600
        state = (await target_nc.jetstream().stream_info("FLEET")).state
        assert (state.first_seq, state.last_seq) == (1, 600)
    finally:
        await nc2.close()


@pytest.mark.timeout(60)
async def test_the_target_keys_set_the_region_limits_and_a_tighter_region_is_warned_about(
    source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client, target_nc: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="replicator")
    await make_stream(source_nc, **CITY)
    await publish_many(source_nc, 10)
    keys = {"target_max_msgs": 50_000, "target_max_bytes": 1 << 30, "target_max_age": "7d",
            "target_max_msgs_per_subject": 1000, "target_discard": "new"}
    async with InProcess(profile_for(topic_config(source_server.url, target_server.url, **keys))):
        assert await wait_count(target_nc, "FLEET", 10, 30) is not None
        line = await wait_for_log(caplog, "created target stream FLEET")
    assert "limits max_msgs 50000, max_bytes 1073741824, max_msgs_per_subject 1000, discard new" in line, line
    config = (await target_nc.jetstream().stream_info("FLEET")).config
    assert (config.max_msgs, config.max_bytes, config.max_msgs_per_subject) == (50_000, 1 << 30, 1000)
    assert config.max_age == 7 * 86400 and config.discard == DiscardPolicy.NEW

    # An existing region sized below the city: it would drop copies the city still holds.
    await target_nc.jetstream().delete_stream("FLEET")
    await make_stream(target_nc, max_msgs=100, max_age=60.0)
    caplog.clear()
    async with InProcess(profile_for(topic_config(source_server.url, target_server.url, target_max_msgs=5000))):
        warning = await wait_for_log(caplog, "has tighter limits than source stream FLEET")
        kept = await wait_for_log(caplog, "left as it is")
    assert "max_msgs 100 (the source's: 300)" in warning and "max_age 60.0 (the source's: 3600.0)" in warning
    assert "discards copies that the source still holds" in warning, warning
    assert "target_max_msgs 5000 (the stream's: 100)" in kept, kept
