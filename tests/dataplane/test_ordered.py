from __future__ import annotations

from tests.dataplane.helpers import (
    InProcess,
    indices,
    make_stream,
    profile_for,
    publish_many,
    read_all,
    source_seqs,
    topic_config,
    wait_for_count,
)


async def test_ordered_copies_everything_in_order(source_server, target_server, source_nc, target_nc):
    await make_stream(source_nc)
    await publish_many(source_nc, 12_000)
    profile = profile_for(topic_config(source_server.url, target_server.url))
    async with InProcess(profile):
        assert await wait_for_count(target_nc, "FLEET", 12_000) == 12_000
    msgs = await read_all(target_nc, "FLEET")
    assert indices(msgs) == list(range(12_000))
    assert source_seqs(msgs) == list(range(1, 12_001))
