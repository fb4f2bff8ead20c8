"""Wires the sampling plane (limiter state, limiters, advisories, election) into a running profile.

One per process: one state store shared by all workers, one limiter per worker, one advisor that
only the elected leader runs, and the election itself on a control connection of its own so lease
renewals never queue behind copy traffic.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.aio.client import Client

from replicator.config.model import Profile
from replicator.copier.control import Stopper
from replicator.copier.endpoints import Decider
from replicator.observe.metrics import WorkerMetrics
from replicator.transport.connections import connect

if TYPE_CHECKING:  # the sampling plane's parts are imported by the profiles that use them
    from replicator.sampling.advisories import Advisor
    from replicator.sampling.clock import StreamClock
    from replicator.sampling.election import LeaderElection
    from replicator.sampling.state.protocol import StateStore

log = logging.getLogger(__name__)


@dataclass
class SamplingPlane:
    profile: Profile
    control: Client | None = None
    store: StateStore | None = None
    election: LeaderElection | None = None
    advisor: Advisor | None = None
    clock: StreamClock | None = None  # silence judged on the stream's time (`sampling/clock.py`)

    @property
    def copy_election(self) -> LeaderElection | None:
        """The election that gates copying (ordered hot standby); in scaled mode it gates advising only."""
        return self.election if self.profile.settings.leader_election else None

    @classmethod
    async def create(cls, profile: Profile, source: Client, target: Client, metrics: list[WorkerMetrics],
                     stopper: Stopper) -> SamplingPlane:
        settings = profile.settings
        # With KV state several processes see the same senders: only one of them may advise.
        elect = settings.leader_election or bool(settings.advisory and settings.limiter_state == "kv")
        plane = cls(profile)
        if not settings.sampling and not elect:
            return plane
        instance = f"_{profile.instance}" if profile.instance else ""
        plane.control = await connect(profile, "source", f"{profile.base_name}{instance}_control", metrics[0],
                                      stopping=lambda: stopper.stopping)
        js = plane.control.jetstream()
        if settings.sampling:
            from replicator.sampling.state import open_store

            plane.store = await open_store(profile, js, metrics[0])
        if settings.advisory:
            from replicator.sampling.advisories import Advisor
            from replicator.sampling.blind import BlindSpots
            from replicator.sampling.clock import StreamClock

            assert plane.store is not None
            # A restart resumes a blind spot from the newest sender the store remembers (file, KV).
            since = max((s.seen for k in plane.store.keys() if (s := plane.store.get(k)) is not None), default=0.0)
            plane.clock = StreamClock(max(2.0, plane.store.resolution), since=since)

            publish_nc = plane.control if settings.advisory.cluster == "source" else target
            replicator = profile.replicator if settings.advisory.format == "v2" else profile.metrics_name
            plane.advisor = Advisor(profile, plane.store, publish_nc, metrics[0],
                                    replicator_name=replicator, clock=plane.clock.now, judging=plane.clock.judging,
                                    wall=plane.clock.wall)
            plane.clock.on_blind_spot = BlindSpots(plane.advisor)
            plane.clock.before_catching_up = plane.advisor.judge_now
            await plane.advisor.start()
        if elect:
            from replicator.sampling.election import LeaderElection, election_bucket, election_key

            identity = f"{socket.gethostname()}:{os.getpid()}:{profile.instance or '-'}"
            role = "" if settings.leader_election else "advisor"
            bucket = settings.leader_election_bucket or election_bucket(settings.leader_election_ttl)
            plane.election = LeaderElection(js, bucket, election_key(profile, role), identity,
                                            settings.leader_election_ttl, metrics[0],
                                            adopt_ttl=bool(settings.leader_election_bucket))
            if plane.advisor is not None:
                plane.election.on_change(plane.advisor.set_active)
            await plane.election.start()
        elif plane.advisor is not None:
            plane.advisor.set_active(True)
        return plane

    def limiter_for(self, metrics: WorkerMetrics) -> Decider | None:
        if self.store is None:
            return None
        from replicator.sampling.limiter import Limiter

        return Limiter(self.profile.settings, self.store, metrics, clock=self.clock.now if self.clock else time.time)

    async def watch(self, source_stream: str) -> None:
        """Start the stream clock's reads of the copy's consumer (its pending counts)."""
        if self.clock is not None and self.control is not None:
            await self.clock.start(self.control, source_stream, self.profile.consumer_name)

    async def close(self) -> None:
        """After the copiers stopped: release leadership, stop advising, save state, disconnect."""
        if self.election is not None:
            with contextlib.suppress(Exception):
                await self.election.stop()
        if self.clock is not None:
            await self.clock.stop()
        if self.advisor is not None:
            with contextlib.suppress(Exception):
                await self.advisor.stop()
        if self.store is not None:
            try:
                await self.store.close()
            except Exception as err:  # shutting down: a store that cannot save must not keep the rest open
                log.warning("limiter state not saved: %s", err)
        if self.control is not None and not self.control.is_closed:
            with contextlib.suppress(Exception):
                await self.control.drain()
