"""The sampling rule on the memory store, with a hand-driven clock so every decision is exact."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import defaultdict

import pytest

from replicator.sampling.limiter import Limiter, splay
from replicator.sampling.state.memory import MemoryStore
from tests.sampling.helpers import FakeClock, body, make_profile, value, worker_metrics


def limiter_for(clock: FakeClock, **topic: object) -> tuple[Limiter, MemoryStore]:
    settings = make_profile(**topic).settings  # type: ignore[arg-type]
    metrics = worker_metrics()
    store = MemoryStore(settings, metrics, clock=clock)
    return Limiter(settings, store, metrics, clock=clock), store


async def test_thousand_senders_forwarded_once_per_age_over_several_periods(clock: FakeClock) -> None:
    age, step, periods = 10.0, 0.25, 5
    limiter, _ = limiter_for(clock, age=age)
    senders = [f"node-{n:04d}.example.net" for n in range(1000)]
    copies: dict[str, list[float]] = defaultdict(list)
    rng = random.Random(7)
    start = clock.now
    ticks = int(periods * age / step)
    for _ in range(ticks):
        order = senders[:]
        rng.shuffle(order)  # arrival order changes every round, as on a real bus
        for sender in order:
            if await limiter.should_copy("acme.cmdb", None, body(sender, data="x" * 10)):
                copies[sender].append(clock.now)
        clock.advance(step)

    assert set(copies) == set(senders)
    for sender in senders:
        times = copies[sender]
        assert times[0] == start  # new senders go up at once
        interval = age - splay(sender, age)
        for previous, current in itertools.pairwise(times):
            gap = current - previous
            # never within its interval, and at the first message once the interval passed
            assert interval <= gap < interval + step, (sender, gap, interval)
        assert len(times) >= periods  # at least once per age over the whole run
    total = sum(len(t) for t in copies.values())
    assert value(limiter.metrics.limiter_passed) == total
    assert value(limiter.metrics.limiter_skipped) == ticks * len(senders) - total
    # the splay spreads the fleet: the second copies do not land in one tick
    assert len({t[1] for t in copies.values()}) >= 4


async def test_update_flag_must_be_true_not_merely_present(clock: FakeClock) -> None:
    limiter, _ = limiter_for(clock, update_flag="meta.updated")
    assert await limiter.should_copy("acme.cmdb", None, body("n1", meta={"updated": False}))
    for flag in (False, "false", "no", "0", None, "", {"x": 1}):
        clock.advance(1)
        assert not await limiter.should_copy("acme.cmdb", None, body("n1", meta={"updated": flag})), flag
    for flag in (True, "true", "yes", "1"):
        clock.advance(1)
        assert await limiter.should_copy("acme.cmdb", None, body("n1", meta={"updated": flag})), flag
    clock.advance(1)
    assert not await limiter.should_copy("acme.cmdb", None, body("n1"))  # back to the interval


async def test_update_flag_in_a_header_for_non_json_topics(clock: FakeClock) -> None:
    limiter, _ = limiter_for(clock, inspect=None, inspect_header="Sender", update_flag="Updated")
    assert await limiter.should_copy("s", {"Sender": "n1"}, b"\x00\x01")
    clock.advance(1)
    assert not await limiter.should_copy("s", {"Sender": "n1", "Updated": "no"}, b"\x00\x01")
    assert await limiter.should_copy("s", {"Sender": "n1", "Updated": "yes"}, b"\x00\x01")


async def test_size_trigger_compares_with_the_last_copy(clock: FakeClock) -> None:
    limiter, _ = limiter_for(clock, size_trigger=100)

    async def send(size: int) -> bool:
        clock.advance(1)
        head = b'{"sender": "n1", "pad": "'
        payload = head + b"x" * (size - len(head) - 2) + b'"}'
        assert len(payload) == size
        return await limiter.should_copy("acme.cmdb", None, payload)

    assert await send(200)
    assert not await send(270)  # +70 from the copied 200
    assert await send(301)  # +101 from the copied 200: copy
    assert not await send(330)  # +29 from the copied 301
    assert await send(200)  # shrinking counts too
    assert not await send(250)


async def test_messages_without_a_key_are_copied_and_counted(clock: FakeClock) -> None:
    limiter, store = limiter_for(clock, inspect="host.fqdn")
    bad = [b"garbage", b"\xff\xfe\x00", b'{"host": {}}', b'{"host": ', b"[1,2]", b'{"host": {"fqdn": null}}',
           b""]
    for payload in bad:
        assert await limiter.should_copy("acme.cmdb", None, payload) is True
    assert value(limiter.metrics.limiter_errors) == len(bad)
    assert value(limiter.metrics.limiter_passed) == 0
    assert len(store) == 0


async def test_a_forgotten_sender_is_new_again_and_copied_at_once(clock: FakeClock) -> None:
    new: list[str] = []
    settings = make_profile(age=10).settings
    metrics = worker_metrics()
    store = MemoryStore(settings, metrics, clock=clock)
    limiter = Limiter(settings, store, metrics, clock=clock, on_new=new.append)
    assert await limiter.should_copy("acme.cmdb", None, body("n1"))
    assert await limiter.should_copy("acme.cmdb", None, body("n2"))
    # n2 keeps talking (every 2 s): it is never forgotten, and copied every interval only
    copies = 0
    for _ in range(10):
        clock.advance(2)
        copies += await limiter.should_copy("acme.cmdb", None, body("n2"))
    assert copies == 2  # 20 s = two intervals
    assert new == ["n1", "n2"]
    # n1 was silent for 20 s >= age: forgotten, so it is new again and goes up at once
    assert await limiter.should_copy("acme.cmdb", None, body("n1"))
    assert new == ["n1", "n2", "n1"]
    sender = store.get("n1")
    assert sender is not None and sender.first == clock.now
    # the scrubber really frees it once nothing owns it any more (no advisories: at age)
    clock.advance(10)
    assert await store.scrub(clock.now) == 2
    assert len(store) == 0 and value(metrics.limiter_seen) == 0


async def test_the_store_scrubs_on_its_own(clock: FakeClock) -> None:
    limiter, store = limiter_for(clock, age=1)
    await store.start()
    try:
        for n in range(50):
            await limiter.should_copy("acme.cmdb", None, body(f"n{n}"))
        clock.advance(1.5)
        for _ in range(100):
            if len(store) == 0:
                break
            await asyncio.sleep(0.02)
        assert len(store) == 0
    finally:
        await store.close()


async def test_every_key_kind_samples_end_to_end(clock: FakeClock) -> None:
    kinds = {
        "inspect": ({"inspect": "host.name"},
                    lambda s: ("fleet.reg", None, json.dumps({"host": {"name": s}}))),
        "header": ({"inspect": None, "inspect_header": "Sender"},
                   lambda s: ("fleet.reg", {"Sender": s}, "\x00")),
        "token": ({"inspect": None, "inspect_subject_token": 3},
                  lambda s: (f"fleet.reg.{s}.x", None, "{}")),
    }
    for name, (topic, message) in kinds.items():
        limiter, store = limiter_for(FakeClock(clock.now), age=10, **topic)
        for round_ in range(3):
            copied = []
            for s in ("a", "b", "c"):
                subject, headers, payload = message(s)
                copied.append(await limiter.should_copy(subject, headers, payload.encode()))
            assert copied == [round_ == 0] * 3, name  # first round copies, the next two skip
            limiter.clock.advance(1)  # type: ignore[attr-defined]
        assert sorted(store.keys()) == ["a", "b", "c"], name
        assert value(limiter.metrics.limiter_errors) == 0, name


KEY_SETTINGS = [
    {"inspect": "sender"},
    {"inspect": "identity.fqdn", "update_flag": "updated"},
    {"inspect": None, "inspect_header": "Sr-Sender", "update_flag": "updated"},
    {"inspect": None, "inspect_subject_token": 3},
]


@pytest.mark.parametrize("topic", KEY_SETTINGS, ids=lambda t: "+".join(k for k, v in t.items() if v))
async def test_the_fused_check_decides_exactly_as_the_general_one(clock: FakeClock, topic: dict[str, object]) -> None:
    """A store whose table decides runs a fused check, whatever the key is: every kind of message
    through it and through `check_general`, with the same clock, gets the same decision, the same
    counts and the same table (new, skipped, due, forgotten, forced and keyless senders, keys that
    are numbers, empty or missing, bodies that are not JSON, a sender timed out by the advisor,
    rows freed by the scrubber and taken again)."""
    fused, fused_store = limiter_for(clock, age=10.0, **topic)
    general, general_store = limiter_for(clock, age=10.0, **topic)
    assert fused.fused is not None and fused.check != fused.check_general  # the fused path is in use
    general.check = general.check_general
    rng = random.Random(11)
    keys: list[object] = [f"node-{n}" for n in range(40)] + [7, 2.5, True, "", None, {"a": 1}]
    for step in range(3000):
        roll = rng.random()
        sender = rng.choice(keys)
        flag = rng.choice([True, "yes", False, None]) if rng.random() < 0.05 else None
        doc = {"sender": sender, "identity": {"fqdn": sender}, "updated": flag, "pad": "x" * rng.randrange(50)}
        if roll < 0.02:
            payload = b"\x00not json"
        elif roll < 0.04:
            payload = json.dumps({"other": 1}).encode()
        else:
            payload = json.dumps(doc).encode()
        headers = {"Sr-Sender": str(sender)} if isinstance(sender, str) and rng.random() < 0.95 else None
        if headers and flag is True and rng.random() < 0.5:
            headers["updated"] = "true"
        subject = f"acme.cmdb.{sender}" if isinstance(sender, str) and sender else "acme.cmdb"
        if step == 1500:  # the advisor timed one out: its next message must reach the listeners' path
            for store in (fused_store, general_store):
                i = store.table.slot("node-3")
                if i is not None:
                    store.table.adv[i] = clock.now
        if step in (1000, 2000):  # senders silent for `age` go, and their rows are free
            removed = [await store.scrub(clock.now) for store in (fused_store, general_store)]
            assert removed[0] == removed[1] > 0
        decisions = [limiter.check(subject, headers, payload, step + 1) for limiter in (fused, general)]
        assert decisions[0] == decisions[1], (step, payload)
        clock.advance(rng.choice((0.0, 0.01, 0.5, 3.0, 11.0)) if rng.random() < 0.05 else 0.01)
    for limiter in (fused, general):
        limiter.flush()
    for name in ("limiter_passed", "limiter_skipped", "limiter_skipped_bytes", "limiter_errors", "limiter_forced"):
        assert value(getattr(fused.metrics, name)) == value(getattr(general.metrics, name)), name
    assert value(fused.metrics.limiter_skipped) > 1000  # the fused skip path did the work
    assert value(fused.metrics.limiter_errors) > 0  # keyless messages met
    if topic.get("update_flag"):
        assert value(fused.metrics.limiter_forced) > 0  # forced copies met
    assert fused_store.table.snapshot() == general_store.table.snapshot()


async def test_a_listener_hears_of_every_new_sender_the_fused_check_copies(clock: FakeClock) -> None:
    """Without listeners the fused check adds a new sender's row itself; with one (the advisor)
    every new sender goes through `insert`, which tells it."""
    limiter, store = limiter_for(clock, age=10.0)
    heard: list[str] = []
    assert await limiter.should_copy("acme.cmdb", None, body("quiet"), 1)
    store.add_listener(heard.append)
    for n, sender in enumerate(("a", "b", "quiet", "a"), start=2):
        await limiter.should_copy("acme.cmdb", None, body(sender), n)
    assert heard == ["a", "b"]
    rows = store.table.snapshot()
    assert rows["quiet"] == [clock.now, clock.now, clock.now, len(body("quiet")), 0.0, 0, 1]
    assert rows["a"][-1] == 2 and rows["b"][-1] == 3
