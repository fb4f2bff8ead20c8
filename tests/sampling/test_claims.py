"""A copy is claimed before it lands: the message that claimed it, delivered again because the copy
was never confirmed (a worker killed, a publish failed and nak'ed), is copied again on every store,
while the sender's other messages stay sampled out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.client import Client

from replicator.config.model import TopicConfig
from replicator.sampling.limiter import Limiter
from replicator.sampling.state import open_store
from replicator.sampling.state.file import FILE_FORMAT, FileStore
from replicator.sampling.state.kv import KVStore
from replicator.sampling.state.kv_bucket import read_kv_state
from replicator.sampling.state.memory import MemoryStore
from replicator.sampling.state.protocol import StateStore
from tests.sampling.helpers import FakeClock, body, make_profile, value, worker_metrics

SENDERS = [f"n{n}.example.net" for n in range(50)]


async def decide(limiter: Limiter, sender: str, seq: int, header: bool = False) -> bool:
    if header:
        return await limiter.should_copy("acme.cmdb", {"Sender": sender}, b"\x00", seq)
    return await limiter.should_copy("acme.cmdb", None, body(sender), seq)


@pytest.mark.parametrize("key", ["field", "header"])
async def test_memory_store_copies_the_claiming_message_again_and_only_it(clock: FakeClock, key: str) -> None:
    """`field` takes the limiter's fused path, `header` the general one."""
    topic = {"inspect": None, "inspect_header": "Sender"} if key == "header" else {}
    settings = make_profile(**topic).settings
    metrics = worker_metrics()
    limiter = Limiter(settings, MemoryStore(settings, metrics, clock=clock), metrics, clock=clock)
    header = key == "header"
    assert await decide(limiter, "n1", 5, header)  # new: claimed by sequence 5
    clock.advance(1)
    assert not await decide(limiter, "n1", 6, header)
    assert await decide(limiter, "n1", 5, header)  # 5 again: its copy was never confirmed
    assert not await decide(limiter, "n1", 6, header)  # a redelivered skip stays a skip
    assert not await decide(limiter, "n1", 0, header)  # no sequence known: the plain rule
    assert value(metrics.limiter_passed) == 2 and value(metrics.limiter_skipped) == 3


async def claim_all(limiter: Limiter) -> None:
    for n, sender in enumerate(SENDERS):
        assert await decide(limiter, sender, 100 + n)


async def assert_claims_honoured(store: StateStore, settings: TopicConfig, clock: FakeClock) -> None:
    """A restarted process: each sender's claiming message is copied, any other one skipped."""
    limiter = Limiter(settings, store, worker_metrics("after"), clock=clock)
    assert not any([await decide(limiter, s, 1000 + n) for n, s in enumerate(SENDERS)])
    assert all([await decide(limiter, s, 100 + n) for n, s in enumerate(SENDERS)])
    assert not any([await decide(limiter, s, 2000 + n) for n, s in enumerate(SENDERS)])


async def test_file_store_keeps_each_claim_across_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file", age=60)
    metrics = worker_metrics()
    store = await open_store(profile, None, metrics, clock=clock)  # type: ignore[arg-type]
    await claim_all(Limiter(profile.settings, store, metrics, clock=clock))
    assert isinstance(store, FileStore)
    await store.save()  # the periodic save, then SIGKILL: close never runs
    rows = json.loads(profile.state_file().read_text())["senders"]
    assert rows[SENDERS[3]][6] == 103

    clock.advance(5)
    store2 = await open_store(profile, None, worker_metrics("2"), clock=clock)  # type: ignore[arg-type]
    try:
        await assert_claims_honoured(store2, profile.settings, clock)
    finally:
        await store2.close()


async def test_file_written_before_claims_were_kept_still_loads(tmp_path: Path, clock: FakeClock) -> None:
    profile = make_profile(tmp_path, limiter_state="file", age=60)
    path = profile.state_file()
    path.write_text(json.dumps({"format": FILE_FORMAT, "saved": clock.now,
                                "senders": {"n1": [clock.now, clock.now, clock.now, 10, 0, 1]}}))
    store = await open_store(profile, None, worker_metrics(), clock=clock)  # type: ignore[arg-type]
    try:
        sender = store.get("n1")
        assert sender is not None and sender.src == 0 and sender.size == 10
        limiter = Limiter(profile.settings, store, worker_metrics("l"), clock=clock)
        assert not await decide(limiter, "n1", 7)
    finally:
        await store.close()


async def test_kv_claims_outlive_the_process_that_made_them(source_nc: Client, clock: FakeClock) -> None:
    profile = make_profile(limiter_state="kv", age=60)
    js = source_nc.jetstream()
    metrics = worker_metrics()
    store = await open_store(profile, js, metrics, clock=clock)
    assert isinstance(store, KVStore)
    await claim_all(Limiter(profile.settings, store, metrics, clock=clock))
    records = await read_kv_state(js, store.bucket)
    assert records[SENDERS[7]].src == 107
    await store._unwatch()  # killed: its watch dies with it, nothing else is written

    clock.advance(5)
    store2 = await open_store(profile, js, worker_metrics("2"), clock=clock)
    try:
        await assert_claims_honoured(store2, profile.settings, clock)
        records = await read_kv_state(js, store.bucket)
        assert records[SENDERS[7]].src == 107  # claimed again by the same message
    finally:
        await store2.close()
        await store.close()
