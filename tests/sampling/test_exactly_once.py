"""Advisories exactly once: 3 workers in 2 processes on one KV, only the elected leader advises,
and the leader is lost (crash, no release) in the middle."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from replicator.config import Profile
from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.advisories import Advisor
from replicator.sampling.election import LeaderElection, election_bucket, election_key
from replicator.sampling.limiter import Limiter, splay
from replicator.sampling.state import open_store
from replicator.sampling.state.protocol import StateStore
from tests.sampling.helpers import body, eventually, make_profile, validate_advisory, value, worker_metrics

AGE, ADVISORY_AGE, TTL = 4.0, 1.5, 2.0


@dataclass
class Process:
    """What one replicator pod builds for a sampling topic with advisories."""

    name: str
    source: Client
    target: Client
    store: StateStore
    advisor: Advisor
    election: LeaderElection
    limiters: list[Limiter] = field(default_factory=list)

    @classmethod
    async def start(
        cls, name: str, profile: Profile, source_url: str, target_url: str, workers: int
    ) -> Process:
        source, target = await nats.connect(source_url), await nats.connect(target_url)
        metrics = worker_metrics(f"{name}_0")
        store = await open_store(profile, source.jetstream(), metrics)
        advisor = Advisor(profile, store, target, metrics, replicator_name="dc1")
        election = LeaderElection(source.jetstream(), election_bucket(TTL), election_key(profile, "advisor"),
                                  name, TTL, metrics)
        election.on_change(advisor.set_active)
        await advisor.start()
        await election.start()
        proc = cls(name, source, target, store, advisor, election)
        proc.limiters = [
            Limiter(profile.settings, store, worker_metrics(f"{name}_{i}")) for i in range(workers)
        ]
        return proc

    async def close(self) -> None:
        await self.election.stop()
        await self.advisor.stop()
        await self.store.close()
        await self.source.close()
        await self.target.close()


async def test_advisories_exactly_once_across_processes_and_a_failover(
    source_server: LocalNatsServer, target_server: LocalNatsServer, target_nc: Client
) -> None:
    profile = make_profile(limiter_state="kv", age=AGE, leader_election_ttl=TTL,
                           advisory={"target": "sr.adv.cmdb", "cluster": "target", "age": ADVISORY_AGE})
    await target_nc.jetstream().add_stream(name="ADV", subjects=["sr.adv.>"])
    published: list[dict[str, object]] = []  # every publish, duplicates included (core subscriber)

    async def on_adv(msg: Msg) -> None:
        doc = json.loads(msg.data)
        validate_advisory(doc)
        published.append(doc)

    await target_nc.subscribe("sr.adv.cmdb", cb=on_adv)

    a = await Process.start("A", profile, source_server.url, target_server.url, workers=2)
    await a.election.wait_leader()
    b = await Process.start("B", profile, source_server.url, target_server.url, workers=1)
    workers = [*a.limiters, *b.limiters]

    senders = [f"node-{n:02d}" for n in range(30)]
    active = set(senders)
    forwarded: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (before, after) the decision
    stop = asyncio.Event()
    rng = random.Random(3)

    async def fleet() -> None:
        while not stop.is_set():
            sends = [(s, rng.choice(workers)) for s in sorted(active)]
            before = time.time()
            results = await asyncio.gather(*(w.should_copy("acme.cmdb", None, body(s)) for s, w in sends))
            after = time.time()
            for (s, _), copied in zip(sends, results, strict=True):
                if copied:
                    forwarded[s].append((before, after))
            await asyncio.sleep(0.1)

    def count(event: str, among: list[str] | None = None) -> int:
        return sum(1 for d in published if d["event"] == event and (among is None or d["value"] in among))

    running = asyncio.ensure_future(fleet())
    try:
        await eventually(lambda: count("new") >= 30, within=5)
        quiet, back, gone = senders[:10], senders[:5], senders[5:10]
        active.difference_update(quiet)
        await asyncio.sleep(0.2)

        await a.election.stop(release=False)  # the leader dies without releasing its lock
        await b.election.wait_leader()  # ... and B takes over once the lock expires
        assert not a.advisor.active and b.advisor.active

        await eventually(lambda: count("timeout", quiet) >= 10, within=5)
        active.update(back)
        await eventually(lambda: count("recover", back) >= 5 and count("expire", gone) >= 5, within=8)
        await asyncio.sleep(0.5)  # anything extra would show up now
    finally:
        stop.set()
        await running
        await a.close()
        await b.close()

    per_event = Counter((d["event"], d["value"]) for d in published)
    expected = Counter({("new", s): 1 for s in senders})
    expected.update({("timeout", s): 1 for s in quiet})
    expected.update({("recover", s): 1 for s in back})
    expected.update({("expire", s): 1 for s in gone})
    assert per_event == expected, per_event - expected or expected - per_event
    assert len({d["event_id"] for d in published}) == len(published)
    stored = (await target_nc.jetstream().stream_info("ADV")).state.messages
    assert stored == len(published)
    # advisories came from A before the crash and from B after it
    assert value(a.advisor.metrics.advisories["new"]) == 30
    assert value(b.advisor.metrics.advisories["timeout"]) == 10
    # and sampling held across the 3 workers: no sender forwarded twice within its interval
    for sender, times in forwarded.items():
        for (first_before, _), (_, second_after) in itertools.pairwise(times):
            assert second_after - first_before >= AGE - splay(sender, AGE), (sender, times)
