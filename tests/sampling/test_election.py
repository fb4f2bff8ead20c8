"""Leader election on a real KV bucket: one leader, fast hand-over, crash take-over, no overlap."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from replicator.demo.local_nats import LocalNatsServer
from replicator.sampling.election import ElectionError, LeaderElection, election_bucket, election_key
from tests.sampling.helpers import eventually, make_profile, value, worker_metrics

TTL = 2.0


class Timeline:
    """Records (monotonic time, who, leader?) for every change of every candidate."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, bool]] = []
        self.samples = 0

    def watch(self, election: LeaderElection, who: str) -> None:
        election.on_change(lambda leader: self.events.append((time.monotonic(), who, leader)))

    async def sample(self, elections: list[LeaderElection], stop: asyncio.Event) -> None:
        """`is_leader` is what gates copying: sample it every 5 ms, it must never be true twice."""
        while not stop.is_set():
            assert sum(e.is_leader for e in elections) <= 1, [e.identity for e in elections if e.is_leader]
            self.samples += 1
            await asyncio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def sampling(self, elections: list[LeaderElection]) -> AsyncIterator[None]:
        """`sample` for as long as the block runs; what it found is raised on leaving the block."""
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(self.sample(elections, stop))
        try:
            yield
        finally:
            stop.set()
        await sampler

    def assert_never_two_leaders(self) -> None:
        leading: set[str] = set()
        for _, who, leader in sorted(self.events):
            if leader:
                assert not leading, f"{who} elected while {leading} still led: {self.events}"
                leading.add(who)
            else:
                leading.discard(who)


@contextlib.asynccontextmanager
async def candidates(
    url: str, n: int, ttl: float = TTL, timeline: Timeline | None = None
) -> AsyncIterator[tuple[list[Client], list[LeaderElection]]]:
    """`n` candidates (pod-0...) on their own connections, watched by `timeline`; stopped and closed on exit."""
    ncs = [await nats.connect(url) for _ in range(n)]
    elections = [
        LeaderElection(nc.jetstream(), election_bucket(ttl), "cmdb_acme_cmdb_stream_replicator",
                       f"pod-{i}", ttl, worker_metrics(f"pod-{i}"))
        for i, nc in enumerate(ncs)
    ]
    if timeline is not None:
        for i, e in enumerate(elections):
            timeline.watch(e, f"pod-{i}")
    try:
        yield ncs, elections
    finally:
        for e in elections:
            await e.stop()
        for nc in ncs:
            await nc.close()  # a no-op for one a test closed itself


def leaders(elections: list[LeaderElection]) -> list[LeaderElection]:
    return [e for e in elections if e.is_leader]


async def test_one_leader_and_a_released_lock_is_taken_over_at_once(source_server: LocalNatsServer) -> None:
    async with candidates(source_server.url, 3) as (_, elections):
        for e in elections:
            await e.start()
        await eventually(lambda: len(leaders(elections)) == 1, within=5)
        await asyncio.sleep(TTL)  # renewals keep it, nobody else gets in
        (leader,) = leaders(elections)
        assert [value(e.metrics.leader) for e in elections] == [1 if e is leader else 0 for e in elections]

        started = time.monotonic()
        await leader.stop()  # releases the key
        took = await eventually(lambda: len(leaders(elections)) == 1, within=TTL * 2)
        assert took < TTL * 0.5 + 0.3  # next campaign (ttl/4), not the TTL
        assert value(leader.metrics.leader) == 0 and not leader.is_leader
        assert time.monotonic() - started < TTL


async def test_stop_returns_when_the_campaign_loop_swallows_a_cancellation(source_server: LocalNatsServer) -> None:
    """Python 3.11's `wait_for` can lose a cancellation that arrives as its publish completes; the
    campaign loop then runs on. A stop must still end it, and return."""
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # as wait_for does when the operation completed in the same instant
        await asyncio.sleep(3600)

    async with candidates(source_server.url, 1) as (_, (election,)):
        await election.start()
        await election.wait_leader()
        assert election._task is not None
        election._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election._task
        election._task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(election.stop())
        done, _ = await asyncio.wait([stopping], timeout=3)  # a stop that waits on the loop never returns
        assert done, "stop is still waiting for the campaign loop"
        assert swallowed.is_set() and not election.is_leader


async def test_crashed_leader_is_replaced_within_two_ttls(source_server: LocalNatsServer) -> None:
    timeline = Timeline()
    async with candidates(source_server.url, 2, timeline=timeline) as (_, elections):
        await elections[0].start()
        await elections[0].wait_leader()
        await elections[1].start()
        await asyncio.sleep(TTL)
        assert elections[0].is_leader and not elections[1].is_leader

        crashed = time.monotonic()
        await elections[0].stop(release=False)  # like kill -9: the key stays until it expires
        await elections[1].wait_leader()
        took = time.monotonic() - crashed
        # the key lives ttl after the last renewal (renewed every ttl/3): never taken before that
        assert TTL * 2 / 3 - 0.05 <= took <= TTL * 2, took
        await asyncio.sleep(0.05)
        timeline.assert_never_two_leaders()


async def test_a_cut_off_leader_steps_down_before_takeover(source_server: LocalNatsServer) -> None:
    """The leader's connection dies (a partition): it must give up *before* the key expires."""
    timeline = Timeline()
    async with candidates(source_server.url, 2, timeline=timeline) as (ncs, elections):
        async with timeline.sampling(elections):
            await elections[0].start()
            await elections[0].wait_leader()
            await elections[1].start()
            await asyncio.sleep(0.5)
            cut = time.monotonic()
            await ncs[0].close()  # renewals fail from now on; its campaign loop keeps running
            await elections[0].wait_lost()
            stepped_down = time.monotonic() - cut
            assert stepped_down <= TTL * 0.75 + 0.1
            await elections[1].wait_leader()
            taken_over = time.monotonic() - cut
            assert stepped_down < taken_over <= TTL * 2
            await asyncio.sleep(0.05)
            timeline.assert_never_two_leaders()
            kinds = [(who, leader) for _, who, leader in sorted(timeline.events)]
            assert kinds == [("pod-0", True), ("pod-0", False), ("pod-1", True)]
        assert timeline.samples > 100


async def test_many_candidates_churning_never_overlap(source_server: LocalNatsServer) -> None:
    timeline = Timeline()
    async with candidates(source_server.url, 4, timeline=timeline) as (_, elections):
        async with timeline.sampling(elections):
            for e in elections:
                await e.start()
            for _ in range(3):  # the current leader leaves cleanly, then comes back as a candidate
                await eventually(lambda: len(leaders(elections)) == 1, within=TTL * 2)
                (leader,) = leaders(elections)
                assert sum(e.is_leader for e in elections) == 1
                await leader.stop()
                await leader.start()
            await asyncio.sleep(0.05)
            timeline.assert_never_two_leaders()


async def test_bucket_and_key_naming(source_nc: Client) -> None:
    assert election_bucket(10) == "SR_ELECTION"
    assert election_bucket(2.5) == "SR_ELECTION_2500MS"
    profile = make_profile(source_cluster_id="dc1")
    assert election_key(profile) == "dc1_cmdb_acme_cmdb_stream_replicator"
    assert election_key(profile, "advisor") == "dc1_cmdb_acme_cmdb_stream_replicator.advisor"
    await source_nc.jetstream().create_key_value(bucket="SR_ELECTION", ttl=30)
    wrong = LeaderElection(source_nc.jetstream(), "SR_ELECTION", "k", "me", 10.0, None)
    with pytest.raises(ElectionError, match="30"):
        await wrong.start()
