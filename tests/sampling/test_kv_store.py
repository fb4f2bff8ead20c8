"""The KV store on a real nats-server: shared between processes, durable, and failing open."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import nats
import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.limiter import Limiter
from replicator.sampling.state import open_store
from replicator.sampling.state.kv import KVStore
from replicator.sampling.state.records import limiter_bucket
from tests.sampling.helpers import FakeClock, body, eventually, make_profile, value, worker_metrics


async def bucket_writes(nc: Client, bucket: str) -> int:
    info = await nc.jetstream().stream_info(f"KV_{bucket}")
    return int(info.state.last_seq)


async def test_state_survives_a_restart(source_nc: Client, clock: FakeClock) -> None:
    profile = make_profile(limiter_state="kv", age=60)
    metrics = worker_metrics()
    store = await open_store(profile, source_nc.jetstream(), metrics, clock=clock)
    assert isinstance(store, KVStore) and store.bucket == limiter_bucket(profile)
    limiter = Limiter(profile.settings, store, metrics, clock=clock)
    senders = [f"n{n}.example.net" for n in range(100)] + ["with space", "ünïcode*>", "=lead", "a..b"]
    for sender in senders:
        assert await limiter.should_copy("acme.cmdb", None, body(sender))
    await store.close()

    clock.advance(30)
    metrics2 = worker_metrics()
    store2 = await open_store(profile, source_nc.jetstream(), metrics2, clock=clock)  # a restarted pod
    try:
        assert sorted(store2.keys()) == sorted(senders)
        limiter2 = Limiter(profile.settings, store2, metrics2, clock=clock)
        assert not any([await limiter2.should_copy("acme.cmdb", None, body(s)) for s in senders])
        clock.advance(30)
        assert all([await limiter2.should_copy("acme.cmdb", None, body(s)) for s in senders])
    finally:
        await store2.close()


async def test_two_processes_never_forward_a_sender_twice_within_age(
    source_server: LocalNatsServer, clock: FakeClock
) -> None:
    """Two stores on two connections (two pods) and three workers, all racing on the same senders."""
    profile = make_profile(limiter_state="kv", age=30)
    ncs = [await nats.connect(source_server.url) for _ in range(2)]
    stores = [await open_store(profile, nc.jetstream(), worker_metrics(f"p{i}"), clock=clock)
              for i, nc in enumerate(ncs)]
    limiters = [Limiter(profile.settings, stores[0], worker_metrics("p0_w0"), clock=clock),
                Limiter(profile.settings, stores[0], worker_metrics("p0_w1"), clock=clock),
                Limiter(profile.settings, stores[1], worker_metrics("p1_w0"), clock=clock)]
    senders = [f"node-{n:03d}" for n in range(200)]
    try:
        for period in range(2):
            forwarded: Counter[str] = Counter()

            async def send(limiter: Limiter, sender: str, forwarded: Counter[str] = forwarded) -> None:
                if await limiter.should_copy("acme.cmdb", None, body(sender)):
                    forwarded[sender] += 1

            for _ in range(3):  # three rounds of every sender on every worker, all at once
                await asyncio.gather(*(send(lim, s) for s in senders for lim in limiters))
                clock.advance(1)
            assert forwarded == Counter(dict.fromkeys(senders, 1)), f"period {period}"
            clock.advance(30)
        assert sum(value(s.metrics.limiter_state_errors) for s in stores) == 0
    finally:
        for store in stores:
            await store.close()
        for nc in ncs:
            await nc.close()


async def test_skips_cost_no_kv_writes(source_nc: Client, clock: FakeClock) -> None:
    profile = make_profile(limiter_state="kv", age=60)
    metrics = worker_metrics()
    store = await open_store(profile, source_nc.jetstream(), metrics, clock=clock)
    try:
        limiter = Limiter(profile.settings, store, metrics, clock=clock)
        for n in range(50):
            await limiter.should_copy("acme.cmdb", None, body(f"n{n}"))
        writes = await bucket_writes(source_nc, store.bucket)  # type: ignore[attr-defined]
        assert writes == 50
        for _ in range(20):
            clock.advance(1)
            for n in range(50):
                assert not await limiter.should_copy("acme.cmdb", None, body(f"n{n}"))
        assert await bucket_writes(source_nc, store.bucket) == writes  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_seen_refreshes_are_coalesced_and_reach_the_other_process(
    source_server: LocalNatsServer, clock: FakeClock
) -> None:
    """Process B sees the sender every 0.25 s; process A (the leader's cache) must learn about it
    before the advisory age passes, from a handful of writes instead of one per message."""
    profile = make_profile(limiter_state="kv", age=20, advisory={"target": "sr.adv", "age": 2})
    nc_a, nc_b = await nats.connect(source_server.url), await nats.connect(source_server.url)
    store_a = await open_store(profile, nc_a.jetstream(), worker_metrics("a"), clock=clock)
    store_b = await open_store(profile, nc_b.jetstream(), worker_metrics("b"), clock=clock)
    assert isinstance(store_a, KVStore) and isinstance(store_b, KVStore)
    try:
        limiter_b = Limiter(profile.settings, store_b, worker_metrics("b0"), clock=clock)
        assert await limiter_b.should_copy("acme.cmdb", None, body("n1"))
        writes = await bucket_writes(nc_a, store_a.bucket)
        worst_lag = 0.0
        for _ in range(32):  # 8 s of messages, 4 advisory ages
            clock.advance(0.25)
            assert not await limiter_b.should_copy("acme.cmdb", None, body("n1"))
            await asyncio.sleep(0.12)  # let the stores' maintenance (every 0.1 s) run
            seen_by_a = store_a.get("n1")
            assert seen_by_a is not None
            worst_lag = max(worst_lag, clock.now - seen_by_a.seen)
        refreshes = await bucket_writes(nc_a, store_a.bucket) - writes
        assert worst_lag < 2.0  # the leader never believes it silent for the advisory age
        assert 3 <= refreshes <= 8  # about one per (advisory age - resolution), not 32
    finally:
        await store_a.close()
        await store_b.close()
        await nc_a.close()
        await nc_b.close()


async def test_kv_outage_fails_open_then_resyncs(source_server: LocalNatsServer, clock: FakeClock) -> None:
    profile = make_profile(limiter_state="kv", age=60)
    nc = await nats.connect(source_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    metrics = worker_metrics()
    store = await open_store(profile, nc.jetstream(), metrics, clock=clock)
    assert isinstance(store, KVStore)
    limiter = Limiter(profile.settings, store, metrics, clock=clock)
    try:
        assert await limiter.should_copy("acme.cmdb", None, body("known"))
        source_server.stop()
        await eventually(lambda: not nc.is_connected, within=5)

        started = time.monotonic()
        assert await limiter.should_copy("acme.cmdb", None, body("during-outage"))  # fail open: copy
        assert not await limiter.should_copy("acme.cmdb", None, body("known"))  # cache still samples
        assert not await limiter.should_copy("acme.cmdb", None, body("during-outage"))
        assert time.monotonic() - started < 1.0  # no waiting on a dead KV in the hot path
        assert value(metrics.limiter_state_errors) >= 1 and store.degraded

        source_server.start()
        await eventually(lambda: not store.degraded, within=15)
        # the decision taken during the outage was written back: a new pod knows it
        other = await open_store(profile, nc.jetstream(), worker_metrics("other"), clock=clock)
        try:
            assert set(other.keys()) == {"known", "during-outage"}
            other_limiter = Limiter(profile.settings, other, worker_metrics("o"), clock=clock)
            assert not await other_limiter.should_copy("acme.cmdb", None, body("during-outage"))
        finally:
            await other.close()
    finally:
        await store.close()
        await nc.close()


async def test_a_deleted_bucket_is_created_again_with_the_state(source_nc: Client, clock: FakeClock) -> None:
    profile = make_profile(limiter_state="kv", age=60)
    metrics = worker_metrics()
    store = await open_store(profile, source_nc.jetstream(), metrics, clock=clock)
    assert isinstance(store, KVStore)
    limiter = Limiter(profile.settings, store, metrics, clock=clock)
    js = source_nc.jetstream()
    try:
        for n in range(20):
            assert await limiter.should_copy("acme.cmdb", None, body(f"n{n}"))
        await js.delete_stream(store.stream)
        assert await limiter.should_copy("acme.cmdb", None, body("after"))  # fails open: copied
        assert not await limiter.should_copy("acme.cmdb", None, body("n3"))  # the cache still samples
        await eventually(lambda: not store.degraded, within=15)

        async def written_back() -> bool:
            try:
                kv = await js.key_value(store.bucket)
                return len(await kv.keys()) == 21
            except Exception:
                return False

        await eventually(written_back, within=10)
        other = await open_store(profile, js, worker_metrics("other"), clock=clock)  # a restarted pod
        try:
            assert sorted(other.keys()) == sorted([f"n{n}" for n in range(20)] + ["after"])
        finally:
            await other.close()
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["memory", "kv"])
async def test_expiry_whatever_the_store(kind: str, source_nc: Client, clock: FakeClock) -> None:
    profile = make_profile(limiter_state=kind, age=5)
    metrics = worker_metrics()
    store = await open_store(profile, source_nc.jetstream(), metrics, clock=clock)
    new: list[str] = []
    limiter = Limiter(profile.settings, store, metrics, clock=clock, on_new=new.append)
    try:
        assert await limiter.should_copy("acme.cmdb", None, body("n1"))
        clock.advance(5)
        assert await limiter.should_copy("acme.cmdb", None, body("n1"))
        assert new == ["n1", "n1"]
        clock.advance(6)
        await eventually(lambda: len(store) == 0, within=5)  # scrubbed by the store itself
    finally:
        await store.close()
