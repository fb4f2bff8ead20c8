"""A fleet of nodes publishing registration-like JSON, for the demo and the benchmarks.

Each node publishes every `interval` seconds at its own phase, so load is smooth. A deterministic
share of nodes goes quiet for a while and comes back (timeout, then recover advisories) and a share
retires for good (timeout, then expire), so the advisories and fleet-health tables have a story.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client

SUBJECT = "fleet.registration"


@dataclass
class Node:
    name: str
    phase: float
    quiet_from: float | None = None  # seconds after start
    quiet_until: float | None = None
    retire_at: float | None = None

    def active(self, t: float) -> bool:
        if self.retire_at is not None and t >= self.retire_at:
            return False
        return not (self.quiet_from is not None and self.quiet_until is not None
                    and self.quiet_from <= t < self.quiet_until)


def build_fleet(nodes: int, duration: float, *, site: str = "ams", seed: int = 42, quiet_share: float = 0.1,
                retire_share: float = 0.05, quiet_for: float = 10.0, interval: float = 2.0) -> list[Node]:
    rng = random.Random(seed)
    fleet = []
    for i in range(nodes):
        node = Node(f"node{i:05d}.{site}.example.net", phase=rng.random() * interval)
        roll = rng.random()
        if roll < retire_share:
            node.retire_at = rng.uniform(0.15, 0.35) * duration
        elif roll < retire_share + quiet_share:
            node.quiet_from = rng.uniform(0.2, 0.4) * duration
            node.quiet_until = node.quiet_from + quiet_for
        fleet.append(node)
    return fleet


def registration(node: Node, seq: int, rng: random.Random, facts_size: int = 1500) -> bytes:
    """Chunky metadata like a configuration-management agent's registration."""
    facts = {
        "os": {"family": "debian", "release": "12", "kernel": "6.1.0"},
        "memory_mb": 16384 + 1024 * (hash(node.name) % 8),
        "uptime_s": seq * 300,
        "load": [round(rng.random() * 2, 2) for _ in range(3)],
        "packages": "x" * facts_size,
    }
    return json.dumps({
        "sender": node.name,
        "site": node.name.split(".")[1],
        "timestamp": int(time.time()),
        "updated": seq % 50 == 49,
        "facts": facts,
    }).encode()


@dataclass
class FleetEmulator:
    nc: Client
    fleet: list[Node]
    interval: float = 2.0
    subject: str = SUBJECT
    published: int = 0
    started: float = field(default_factory=time.monotonic)
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    async def run(self, duration: float, stopping: Callable[[], bool] = lambda: False) -> None:
        js = self.nc.jetstream()
        self.started = time.monotonic()
        next_due = {n.name: n.phase for n in self.fleet}
        counts = dict.fromkeys(next_due, 0)
        tick = min(0.25, self.interval / 4)
        while not stopping():
            t = time.monotonic() - self.started
            if t >= duration:
                break
            futures = []
            for node in self.fleet:
                if next_due[node.name] <= t:
                    next_due[node.name] += self.interval
                    if node.active(t):
                        counts[node.name] += 1
                        body = registration(node, counts[node.name], self.rng)
                        futures.append(await js.publish_async(f"{self.subject}.{node.name.split('.')[0]}", body))
            if futures:
                await asyncio.gather(*futures)
                self.published += len(futures)
            await asyncio.sleep(tick)
