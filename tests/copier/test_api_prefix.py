"""A source reached through a JetStream API prefix: the copy loops make every request of the source
through it (`Endpoints.source_js`), not only their pulls.

The city is a leafnode of its region, each its own JetStream domain; the replicator connects to
the region only and reads the city's stream through `$JS.city.API`. Through the region's own API
the city's stream does not exist: a loop that placed its durable, read the stream for its loss
accounting or parked its durable there could not bind, and copied nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from replicator.copier.control import Stopper
from replicator.copier.endpoints import Endpoints
from replicator.copier.ordered import OrderedCopier
from replicator.copier.scaled import GroupState, ScaledWorker
from replicator.demo.local_nats import LocalNatsServer
from replicator.observe.metrics import Metrics
from tests.copier.helpers import indices, make_stream, profile_for, publish_many, topic_config
from tests.support.faults import read_stream, wait_count

CITY_API = "$JS.city.API"
COUNT = 300
Leaf = tuple[LocalNatsServer, LocalNatsServer]


@pytest.fixture
async def connections(region_and_city: Leaf) -> AsyncIterator[list[Client]]:
    """Source and target connections, both to the region, and one to the city; the streams: FLEET
    in the city's domain only (COUNT messages), REGION in the region's for the copies."""
    region, city = region_and_city
    ncs = [await nats.connect(region.url), await nats.connect(region.url), await nats.connect(city.url)]
    await make_stream(ncs[2])
    await make_stream(ncs[1], "REGION", ["region.fleet.>"])
    await publish_many(ncs[2], COUNT)
    yield ncs
    for nc in ncs:
        await nc.close()


def _endpoints(region_and_city: Leaf, ncs: list[Client], **overrides: Any) -> Endpoints:
    region, city = region_and_city
    profile = profile_for(topic_config(city.url, region.url, target_subject_prefix="region", **overrides))
    return Endpoints(profile, ncs[0], ncs[1], "FLEET", "REGION", "sr_0", Metrics().worker("sr", "sr_0"),
                     api_prefix=CITY_API)


async def _copy(loop: OrderedCopier | ScaledWorker, ncs: list[Client], more: int = 0) -> list[int]:
    """Run the loop until the target holds COUNT copies, and `more` after as many more messages;
    stop it cleanly; the indices the target holds, in its order."""
    run = asyncio.ensure_future(loop.run())
    try:
        assert await wait_count(ncs[1], "REGION", COUNT, 30) is not None, "nothing copied through the prefix"
        if more:
            await publish_many(ncs[2], more, start=COUNT)
            assert await wait_count(ncs[1], "REGION", COUNT + more, 30) is not None
    finally:
        loop.stopper.stop()
        await asyncio.wait_for(run, 30)
    return indices(await read_stream(ncs[1], "REGION"))


@pytest.mark.timeout(90)
async def test_ordered_copier_binds_copies_and_parks_its_durable_through_the_source_api_prefix(
    region_and_city: Leaf, connections: list[Client],
) -> None:
    ep = _endpoints(region_and_city, connections)
    assert await _copy(OrderedCopier(ep), connections, more=COUNT) == list(range(2 * COUNT))  # once each, in order
    # The durable lives in the city's domain, acknowledged up to the last copy, with its owner noted.
    info = await connections[2].jetstream().consumer_info("FLEET", ep.profile.durable_name)
    assert info.ack_floor is not None and info.ack_floor.stream_seq == 2 * COUNT
    assert (info.config.metadata or {}).get("stream-replicator.owner") == ep.profile.base_name


@pytest.mark.timeout(90)
async def test_scaled_worker_creates_the_group_durable_and_copies_through_the_source_api_prefix(
    region_and_city: Leaf, connections: list[Client],
) -> None:
    ep = _endpoints(region_and_city, connections, workers=1, queue_group="fleet_grp")
    assert sorted(await _copy(ScaledWorker(ep, stopper=Stopper(), group=GroupState()), connections)) == list(
        range(COUNT))
    info = await connections[2].jetstream().consumer_info("FLEET", "fleet_grp")
    assert info.num_ack_pending == 0 and info.num_pending == 0
