"""Wires the sampling plane (limiter state, limiters, advisories, election) into a running profile."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client

from replicator.config import Profile
from replicator.copier import Decider, Stopper
from replicator.metrics import WorkerMetrics


@dataclass
class SamplingPlane:
    profile: Profile
    election: None = None

    @classmethod
    async def create(cls, profile: Profile, source: Client, target: Client, metrics: list[WorkerMetrics],
                     stopper: Stopper) -> SamplingPlane:
        return cls(profile)

    def limiter_for(self, metrics: WorkerMetrics) -> Decider | None:
        return None

    def stop_soon(self) -> None:
        pass

    async def close(self) -> None:
        pass
