"""A three-node JetStream cluster on loopback: the clustered R3 targets a centre runs.

Each node is a `LocalNatsServer` with a `cluster` block routing to the other two. Stream leaders
move by the JetStream API's step-down request or by killing the leader's server, as they do in a
fleet when a node is drained, upgraded or lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from replicator.demo.local_nats import LocalNatsServer, free_port


class LocalCluster:
    def __init__(self, store: Path, name: str = "centre", size: int = 3) -> None:
        routes = [free_port() for _ in range(size)]
        self.nodes: list[LocalNatsServer] = []
        for i, port in enumerate(routes):
            others = ", ".join(f'"nats://127.0.0.1:{p}"' for p in routes if p != port)
            block = f'cluster {{\n  name: "{name}"\n  listen: "127.0.0.1:{port}"\n  routes: [{others}]\n}}'
            self.nodes.append(LocalNatsServer(name=f"{name}-{i}", store_dir=store / f"{name}-{i}",
                                              extra_config=block))

    @property
    def urls(self) -> str:
        """Every node, comma-separated, as a replicator's `target_url` lists a cluster."""
        return ",".join(node.url for node in self.nodes)

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def node(self, server_name: str) -> LocalNatsServer:
        return next(node for node in self.nodes if node.name == server_name)

    async def add_stream(self, nc: Client, config: StreamConfig, within: float = 30.0) -> None:
        """Create a stream, retried while the cluster has no meta leader yet (just started)."""
        deadline = time.monotonic() + within
        while True:
            try:
                await nc.jetstream(timeout=5).add_stream(config)
                return
            except (APIError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.5)

    async def leader(self, nc: Client, stream: str, within: float = 30.0) -> str:
        """The server name of the stream's current leader (waiting out an election)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                reply = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=2)).data)
            except Exception:  # the node asked is restarting, or no answer during an election
                reply = {}
            leader = (reply.get("cluster") or {}).get("leader")
            if leader:
                return str(leader)
            await asyncio.sleep(0.2)
        raise AssertionError(f"stream {stream} has no leader after {within}s")

    async def step_down(self, nc: Client, stream: str) -> str:
        """Ask the stream's leader to step down; the new leader's name once elected."""
        before = await self.leader(nc, stream)
        await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = await self.leader(nc, stream)
            if now != before:
                return now
            await asyncio.sleep(0.1)
        raise AssertionError(f"stream {stream}'s leader {before} did not step down")
