"""The KV store's watch (`transport/ordered_watch.py`) on a real nats-server: every entry once and in
order, through flow control, and again after its consumer is lost, from where it stopped."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.js.api import StreamConfig

from replicator.transport.ordered_watch import OrderedWatch
from tests.sampling.helpers import eventually


async def fill(nc: Client, first: int, count: int) -> None:
    js = nc.jetstream()
    acks = [await js.publish_async(f"w.k{n % 50}", str(n).encode()) for n in range(first, first + count)]
    await asyncio.gather(*acks)


async def test_every_entry_once_in_order_through_flow_control_and_a_lost_consumer(source_nc: Client) -> None:
    js = source_nc.jetstream()
    await js.add_stream(StreamConfig(name="W", subjects=["w.>"]))
    got: list[tuple[int, int]] = []  # (stream sequence, payload)

    def on_entry(subject: str, hdr: bytes | None, data: bytes, seq: int, pending: int) -> None:
        got.append((seq, int(data)))

    watch = OrderedWatch(source_nc, js, "W", "w.>", on_entry, heartbeat=0.5)
    try:
        assert await watch.start(1)  # nothing to deliver yet
        await fill(source_nc, 0, 20_000)  # far past what the server sends before asking for flow control
        await eventually(lambda: len(got) >= 20_000, within=30)
        (consumer,) = [c.name for c in await js.consumers_info("W")]
        await js.delete_consumer("W", consumer)  # lost: no heartbeat, no delivery
        await fill(source_nc, 20_000, 100)
        await eventually(lambda: len(got) >= 20_100, within=10)
        await asyncio.sleep(1.5)  # anything delivered twice would show up now
        assert got == [(n + 1, n) for n in range(20_100)]
        assert watch.resets >= 1
    finally:
        await watch.stop()


async def test_from_the_last_entry_of_each_subject(source_nc: Client) -> None:
    js = source_nc.jetstream()
    await js.add_stream(StreamConfig(name="W", subjects=["w.>"]))
    await fill(source_nc, 0, 500)  # ten entries on each of 50 subjects
    got: dict[str, int] = {}
    pending_at_end: list[int] = []

    def on_entry(subject: str, hdr: bytes | None, data: bytes, seq: int, pending: int) -> None:
        assert subject not in got
        got[subject] = int(data)
        pending_at_end.append(pending)

    watch = OrderedWatch(source_nc, js, "W", "w.>", on_entry)
    try:
        assert not await watch.start(None)
        await eventually(lambda: len(got) == 50, within=10)
        assert got == {f"w.k{k}": 450 + k for k in range(50)} and pending_at_end[-1] == 0
    finally:
        await watch.stop()
