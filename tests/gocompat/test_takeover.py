"""Taking over from the Go tool: its durable `SR_<name>`, created and advanced by a plain JetStream
client exactly as the Go tool leaves it (pull, AckExplicit, MaxAckPending 1, `Choria-SR-Source` on
each copy), is continued from its ack floor checked against the target's last message, so
stopping the Go tool and starting ours loses nothing and copies nothing twice."""

from __future__ import annotations

import collections

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from replicator.copier.provenance import CHORIA_SOURCE
from tests.gocompat.conftest import Rig

pytestmark = pytest.mark.timeout(60)


async def go_tool_copies(rig: Rig, stream: str, count: int, *, ack_last: bool) -> None:
    """What the Go tool's source-initiated copier does for `count` messages, then it stops (or dies
    after publishing the last copy and before acknowledging it)."""
    await rig.sjs.add_consumer(stream, ConsumerConfig(
        durable_name="SR_SITE", description="Choria Stream Replicator SITE", ack_policy=AckPolicy.EXPLICIT,
        max_ack_pending=1, ack_wait=30, deliver_policy=DeliverPolicy.ALL))
    pull = await rig.sjs.pull_subscribe_bind("SR_SITE", stream=stream)
    try:
        for n in range(count):
            msg = (await pull.fetch(1, timeout=5))[0]
            meta = msg.metadata
            stamp = int(meta.timestamp.timestamp() * 1000)
            headers = {**(msg.headers or {}), CHORIA_SOURCE: f"{stream} {meta.sequence.stream} SITE SITE {stamp}"}
            await rig.tjs.publish(msg.subject, msg.data, headers=headers)
            if n < count - 1 or ack_last:
                await msg.ack_sync()
    finally:
        await pull.unsubscribe()


@pytest.mark.parametrize("ack_last", [True, False], ids=["stopped", "killed-before-ack"])
async def test_takeover_from_the_go_tools_durable_loses_and_duplicates_nothing(rig: Rig, ack_last: bool) -> None:
    src = rig.name("TAKE")
    root = src.lower()
    await rig.sjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))
    await rig.tjs.add_stream(StreamConfig(name=src, subjects=[f"{root}.>"]))  # the Go tool made it
    for i in range(60):
        await rig.sjs.publish(f"{root}.n{i % 7}", f"{i}".encode())
    await go_tool_copies(rig, src, 25, ack_last=ack_last)
    before = await rig.sjs.consumer_info(src, "SR_SITE")
    assert before.ack_floor.stream_seq == (25 if ack_last else 24)
    assert (await rig.tjs.stream_info(src)).state.messages == 25

    async with rig.replicating(rig.config(rig.stream(src))):
        for i in range(60, 80):
            await rig.sjs.publish(f"{root}.n{i % 7}", f"{i}".encode())
        assert await rig.wait_count(src, 80) == 80
    copied = [int(m.headers[CHORIA_SOURCE].split()[1]) for m in await rig.read(src)]
    counts = collections.Counter(copied)
    lost = [seq for seq in range(1, 81) if seq not in counts]
    duplicated = [seq for seq, n in counts.items() if n > 1]
    print(f"takeover ({'stopped' if ack_last else 'killed before ack'}): Go copied 25, ack floor "
          f"{before.ack_floor.stream_seq}; target {len(copied)} messages, lost {len(lost)}, "
          f"duplicated {len(duplicated)}")
    assert (lost, duplicated) == ([], [])
    assert copied == list(range(1, 81))  # and in order
    after = await rig.sjs.consumer_info(src, "SR_SITE")  # the same durable carries on
    assert after.ack_floor.stream_seq == 80
