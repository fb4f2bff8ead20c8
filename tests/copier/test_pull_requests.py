"""How much each pull request asks for, read off the source server: requests sized by message size
unless `batch` is configured, in both modes."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from replicator.demo.local_nats import LocalNatsServer
from tests.copier.helpers import (
    InProcess,
    make_stream,
    profile_for,
    publish_many,
    topic_config,
    wait_for_count,
)

SCALED = {"workers": 2, "queue_group": "pull_grp", "name": None}


async def requested_batches(source_nc: Client, source_url: str, target_url: str, target_nc: Client,
                            **settings: object) -> list[int]:
    """The `batch` of every pull request a replicator sends while copying 6,000 messages of 300 B."""
    batches: list[int] = []

    async def seen(msg: Msg) -> None:
        batches.append(int(json.loads(msg.data)["batch"]))

    snoop = await source_nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.>", cb=seen)
    await make_stream(source_nc)
    await publish_many(source_nc, 6000, size=300)
    async with InProcess(profile_for(topic_config(source_url, target_url, **settings))):
        assert await wait_for_count(target_nc, "FLEET", 6000) == 6000
    await snoop.unsubscribe()
    return batches


@pytest.mark.parametrize("mode", ["ordered", "scaled"])
async def test_small_messages_are_asked_for_a_megabyte_at_a_time(
    mode: str, source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client, target_nc: Client,
) -> None:
    batches = await requested_batches(source_nc, source_server.url, target_server.url, target_nc,
                                      **(SCALED if mode == "scaled" else {}))
    assert batches[0] == 500  # before anything arrived: the size of large messages
    # 300 B of payload: about 3,300 a megabyte. A scaled worker asks for no more than it has room
    # for in flight (`max_in_flight`, 2,000); the ordered window has room for more.
    if mode == "scaled":
        assert 500 < max(batches) <= 2000, batches
    else:
        assert 2000 <= max(batches) <= 3500, batches


async def test_a_configured_batch_is_what_every_request_asks_for_at_most(
    source_server: LocalNatsServer, target_server: LocalNatsServer, source_nc: Client, target_nc: Client,
) -> None:
    batches = await requested_batches(source_nc, source_server.url, target_server.url, target_nc, batch=100)
    assert batches and max(batches) == 100
