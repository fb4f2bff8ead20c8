"""Advisories: each event at its time, the schema, JetStream de-duplication, core publish, retries."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DiscardPolicy, StreamConfig

from replicator.sampling.advisories import Advisor, build_advisory, event_id
from replicator.sampling.limiter import Limiter
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.records import ANNOUNCED, Sender
from tests.sampling.helpers import (
    FakeClock,
    body,
    eventually,
    make_profile,
    validate_advisory,
    value,
    worker_metrics,
)

SUBJECT = "sr.advisories.cmdb"


async def advisories_in(nc: Client, stream: str = "ADV") -> list[dict[str, Any]]:
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq)
        doc = json.loads(msg.data or b"")
        assert msg.headers and msg.headers["Nats-Msg-Id"] == doc["event_id"]
        validate_advisory(doc)
        out.append(doc)
    return out


class Rig:
    """One process: memory store, a limiter and an active advisor on a fake clock."""

    def __init__(self, nc: Client, clock: FakeClock, *, wall: FakeClock | None = None, **topic: Any) -> None:
        topic.setdefault("age", 10)
        topic.setdefault("advisory", {"target": SUBJECT, "cluster": "target", "age": 4})
        self.profile = make_profile(**topic)
        self.metrics = worker_metrics()
        self.clock = clock
        self.store = MemoryStore(self.profile.settings, self.metrics, clock=clock)
        self.limiter = Limiter(self.profile.settings, self.store, self.metrics, clock=clock)
        self.advisor = Advisor(self.profile, self.store, nc, self.metrics, replicator_name="dc1",
                               clock=clock, retries=2, retry_delay=lambda n: 0.01, wall=wall)

    async def __aenter__(self) -> Rig:
        await self.advisor.start()
        self.advisor.set_active(True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.advisor.stop()

    async def send(self, sender: str) -> bool:
        copied = await self.limiter.should_copy("acme.cmdb", None, body(sender))
        await self.settle()
        return copied

    async def settle(self) -> None:
        await self.advisor.scan()
        await self.advisor.drain()


async def test_each_event_at_its_time(target_nc: Client, clock: FakeClock) -> None:
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    async with Rig(target_nc, clock) as rig:
        start = clock.now
        assert await rig.send("n1")
        clock.advance(3.9)
        await rig.settle()
        events = [a["event"] for a in await advisories_in(target_nc)]
        assert events == ["new"]

        clock.advance(0.2)  # 4.1 s silent: past the advisory age
        await rig.settle()
        clock.advance(1)
        await rig.settle()  # sent once, not on every scan
        assert [a["event"] for a in await advisories_in(target_nc)] == ["new", "timeout"]

        clock.advance(0.9)  # seen again 6 s after it went quiet, before `age`: recover
        assert not await rig.send("n1")  # still within age of its last copy: not copied
        clock.advance(4.5)  # silent again: a second, distinct timeout
        await rig.settle()
        clock.advance(5.5)  # 10 s silent = age: expire, forgotten
        await rig.settle()
        assert len(rig.store) == 0

        clock.advance(2)
        assert await rig.send("n1")  # back after expiry: new again, copied at once

        advisories = await advisories_in(target_nc)
        assert [a["event"] for a in advisories] == ["new", "timeout", "recover", "timeout", "expire", "new"]
        new1, timeout1, recover, timeout2, expire, new2 = advisories
        for a in advisories:
            assert (a["$schema"], a["inspect"], a["value"], a["replicator"], a["topic"]) == (
                "https://choria.io/schemas/sr/v1/age_advisory.json", "sender", "n1", "dc1", "acme.cmdb")
        assert (new1["seen"], new1["age"], new1["timestamp"]) == (int(start), 0, int(start))
        assert (timeout1["seen"], timeout1["age"], timeout1["timestamp"]) == (int(start), 4, int(start + 4.1))
        assert (recover["seen"], recover["age"]) == (int(start + 6), 6)  # silent for 6 s
        assert (timeout2["seen"], timeout2["age"]) == (int(start + 6), 4)
        assert (expire["seen"], expire["age"]) == (int(start + 6), 10)
        assert new2["seen"] == int(clock.now)
        assert len({a["event_id"] for a in advisories}) == 6  # every episode has its own id
        assert {e: value(rig.metrics.advisories[e]) for e in ("new", "timeout", "recover", "expire")} == {
            "new": 2, "timeout": 2, "recover": 1, "expire": 1}
        assert value(rig.metrics.advisories_errors) == 0


async def test_timeouts_wait_a_resolution_after_becoming_leader(target_nc: Client, clock: FakeClock) -> None:
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    async with Rig(target_nc, clock) as rig:
        await rig.send("n1")
        rig.advisor.set_active(False)
        clock.advance(5)  # silent past the advisory age while nobody leads
        await rig.settle()
        rig.advisor.set_active(True)  # a failover: this cache may lag by one resolution
        await rig.settle()
        assert [a["event"] for a in await advisories_in(target_nc)] == ["new"]
        clock.advance(rig.store.resolution)
        await rig.settle()
        assert [a["event"] for a in await advisories_in(target_nc)] == ["new", "timeout"]


async def test_a_restarted_leader_judges_the_backlog_on_the_stream_clock(target_nc: Client, clock: FakeClock) -> None:
    """Restarted an hour behind: the leader's wait is a resolution of wall time, so a sender silent
    past the advisory age within the backlog is advised as it is read, stamped with the stream's time,
    not held until the backlog is read up to the restart."""
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    backlog = clock.now
    wall = FakeClock(backlog + 3600)
    clock.now = wall.now  # nothing of the backlog read yet: the stream clock says the wall's time
    async with Rig(target_nc, clock, wall=wall) as rig:
        clock.now = backlog  # its first message read
        await rig.send("n1")
        clock.advance(5)  # read on: n1 silent past the advisory age (4 s) in the stream's time
        wall.advance(rig.store.resolution)
        await rig.settle()
        new, timeout = await advisories_in(target_nc)
        assert (new["event"], timeout["event"], timeout["timestamp"]) == ("new", "timeout", int(backlog + 5))


async def test_inactive_advisor_sends_nothing(target_nc: Client, clock: FakeClock) -> None:
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    async with Rig(target_nc, clock) as rig:
        rig.advisor.set_active(False)
        await rig.send("n1")
        clock.advance(20)
        await rig.settle()
        assert (await target_nc.jetstream().stream_info("ADV")).state.messages == 0


async def test_resends_are_deduplicated_by_jetstream(target_nc: Client, clock: FakeClock) -> None:
    """A new leader re-sending what the old one published but had not marked yet."""
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    async with Rig(target_nc, clock) as rig:
        sender = Sender(first=clock.now, seen=clock.now, copied=clock.now, size=10)
        names = {"inspect": "sender", "replicator": "dc1", "topic": "acme.cmdb"}
        doc = build_advisory("new", "n1", sender, clock.now, **names)
        again = build_advisory("new", "n1", sender, clock.now + 3, **names)
        assert doc["event_id"] == again["event_id"] == event_id("dc1", "acme.cmdb", "n1", "new", sender.first)
        assert await rig.advisor.publish(doc)
        assert await rig.advisor.publish(again)
        assert len(await advisories_in(target_nc)) == 1


async def test_core_publish_without_a_stream(target_nc: Client, clock: FakeClock) -> None:
    received: list[Msg] = []

    async def on_msg(msg: Msg) -> None:
        received.append(msg)

    await target_nc.subscribe(SUBJECT, cb=on_msg)
    async with Rig(target_nc, clock) as rig:
        await rig.send("n1")
        await eventually(lambda: len(received) == 1, within=3)
    doc = json.loads(received[0].data)
    validate_advisory(doc)
    assert doc["event"] == "new" and received[0].headers == {"Nats-Msg-Id": doc["event_id"]}


async def test_retried_then_counted_as_an_error(target_nc: Client, clock: FakeClock) -> None:
    # a stream that refuses a second message: every later publish fails
    await target_nc.jetstream().add_stream(
        StreamConfig(name="ADV", subjects=["sr.advisories.>"], max_msgs=1, discard=DiscardPolicy.NEW))
    attempts: list[int] = []
    async with Rig(target_nc, clock) as rig:
        rig.advisor.retry_delay = lambda n: attempts.append(n) or 0.01  # type: ignore[func-returns-value]
        await rig.send("n1")  # fills the stream
        await rig.send("n2")  # refused: 1 try + 2 retries, then an error
        assert attempts == [0, 1]
        assert value(rig.metrics.advisories_errors) == 1
        assert value(rig.metrics.advisories["new"]) == 1
        # given up means given up: not retried on every scan for ever
        await rig.settle()
        assert value(rig.metrics.advisories_errors) == 1
        sender = rig.store.get("n2")
        assert sender is not None and sender.announced
    await asyncio.sleep(0)


class FlakyMarks(MemoryStore):
    """A store whose marks fail for a while, as a KV store's do while the KV is unreachable."""

    failures = 3

    async def annotate(self, key: str, *, adv: float | None = None, flags: int | None = None) -> bool:
        if self.failures:
            self.failures -= 1
            return False
        return await super().annotate(key, adv=adv, flags=flags)


async def test_an_unrecorded_advisory_is_not_published_again(target_nc: Client, clock: FakeClock) -> None:
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.advisories.>"])
    received: list[Msg] = []

    async def on_msg(msg: Msg) -> None:
        received.append(msg)

    await target_nc.subscribe(SUBJECT, cb=on_msg)  # sees duplicates that the stream would drop
    async with Rig(target_nc, clock) as rig:
        rig.store.__class__ = FlakyMarks
        await rig.send("n1")
        for _ in range(4):  # marking fails 3 times, then succeeds
            await rig.settle()
        sender = rig.store.get("n1")
        assert sender is not None and sender.announced
        await target_nc.flush()
        await asyncio.sleep(0.1)
    assert len(received) == 1
    assert value(rig.metrics.advisories["new"]) == 1


async def test_a_rounded_last_seen_time_is_not_a_recover(target_nc: Client, clock: FakeClock) -> None:
    """The KV keeps times to the millisecond, the cache exactly: a timed-out sender whose last-seen
    time came back rounded up is still silent, not back."""
    async with Rig(target_nc, clock) as rig:
        seen = clock.now - 4.9994  # rounds up to the millisecond
        assert round(seen, 3) > seen
        assert rig.advisor.next_event(Sender(first=seen, seen=round(seen, 3), copied=seen, size=1,
                                             adv=seen, flags=ANNOUNCED), clock.now) is None
        assert rig.advisor.next_event(Sender(first=seen, seen=clock.now, copied=seen, size=1, adv=seen,
                                             flags=ANNOUNCED), clock.now) == "recover"
