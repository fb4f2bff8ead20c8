"""The drop-in suite's rig: one source and one target `nats-server` per module (tests use their
own stream names), Go-format configs, and the `replicate` process run in-process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from replicator.config import Profile, parse_config
from replicator.demo.local_nats import LocalNatsServer, free_port
from replicator.service.process import ReplicatorProcess
from tests.support.faults import StoredMsg, read_stream, stream_count

_names = itertools.count(1)


@dataclass
class Sites:
    source: LocalNatsServer
    target: LocalNatsServer


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    source = LocalNatsServer(name="source", store_dir=tmp_path_factory.mktemp("go-source"))
    target = LocalNatsServer(name="target", store_dir=tmp_path_factory.mktemp("go-target"))
    source.start()
    target.start()
    yield Sites(source, target)
    source.close()
    target.close()


class Rig:
    """One test's view of the sites: clients, fresh names, Go-format configs, a running process."""

    def __init__(self, sites: Sites, source: Client, target: Client) -> None:
        self.sites = sites
        self.source = source
        self.target = target
        self.sjs = source.jetstream(timeout=5)
        self.tjs = target.jetstream(timeout=5)

    @staticmethod
    def name(base: str) -> str:
        """A stream name (and, lower-cased, a subject root) no other test of the module uses."""
        return f"{base}{next(_names)}"

    def stream(self, base: str, **settings: Any) -> dict[str, Any]:
        """A `streams[]` entry copying between the two sites."""
        return {"source_url": self.sites.source.url, "target_url": self.sites.target.url, "stream": base,
                **settings}

    @staticmethod
    def config(*streams: dict[str, Any], **top: Any) -> dict[str, Any]:
        return {"name": "SITE", "streams": list(streams), **top}

    @contextlib.asynccontextmanager
    async def replicating(self, config: dict[str, Any], *, monitor: bool = False) -> AsyncIterator[ReplicatorProcess]:
        """`stream-replicator replicate` on `config`, in this event loop, stopped cleanly on exit."""
        if monitor:
            config = {**config, "monitor_port": free_port()}
        parsed = parse_config(config, "go.yaml")
        profiles = [Profile(parsed, name, source="go.yaml") for name in parsed.topics]
        process = ReplicatorProcess(parsed, profiles)
        task = asyncio.ensure_future(process.run())
        try:
            yield process
        finally:
            process.stop()
            await asyncio.wait_for(task, 30)

    async def wait_count(self, stream: str, count: int, within: float = 20.0, *, nc: Client | None = None) -> int:
        """The stream's message count once it reached `count` (or whatever it is after `within`)."""
        nc = nc or self.target
        n = -1
        for _ in range(int(within * 10)):
            n = await stream_count(nc, stream)
            if n >= count:
                return n
            await asyncio.sleep(0.1)
        return n

    async def read(self, stream: str, nc: Client | None = None) -> list[StoredMsg]:
        return await read_stream(nc or self.target, stream)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


@pytest.fixture
async def rig(sites: Sites) -> AsyncIterator[Rig]:
    source = await nats.connect(sites.source.url)
    target = await nats.connect(sites.target.url)
    try:
        yield Rig(sites, source, target)
    finally:
        await source.close()
        await target.close()
