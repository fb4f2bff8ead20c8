"""The fault rig: two real servers, a TCP proxy in front of each, replicator processes, a publisher.

The replicator reaches each server only through its proxy, so a test can add latency, cut the
link or half-open it without touching the servers; the test's own connections (publisher and
checks) go straight to the servers, so they see the truth while the replicator suffers.

`add_city` adds a second source server with a same-named stream, its own proxy, publisher and
replicator config (identical but for the URL) fanning into the same target stream: the final check
then compares each source with its own writer's copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.aio.client import Client

from replicator.copier.provenance import stream_identity, writer_id
from replicator.demo.local_nats import LocalNatsServer, free_port
from tests.copier.helpers import make_stream, profile_for, spawn, stop, topic_config, write_config
from tests.support.faults import (
    ContinuousPublisher,
    Outcome,
    compare,
    read_stream,
    stream_count,
    wait_acked,
    wait_count,
    wait_metric,
)
from tests.support.tcp_proxy import ThreadedProxy

STREAM = "FLEET"

BACKLOG = 40_000  # copied in fast-ingest batches (or per message), long enough to strike mid-copy

# Windows that hold either path to about 10,000 msgs/s over a 20 ms RTT target link (a batch
# path window is 4x max_in_flight), so a strike at a count lands well before the backlog's end.
IN_FLIGHT = {"batch": 50, "message": 200}


@dataclass
class City:
    """A second source fanning into the same target (see `Rig.add_city`)."""

    server: LocalNatsServer
    proxy: ThreadedProxy
    nc: Client
    config_path: Path
    publisher: ContinuousPublisher | None = None


class Rig:
    def __init__(self, tmp: Path, source: LocalNatsServer, target: LocalNatsServer, source_nc: Client,
                 target_nc: Client, results: list[Outcome], *, userinfo: str = "",
                 target_urls: str | None = None) -> None:
        self.tmp = tmp
        self.userinfo = userinfo  # "user:password@" for a source with authorization
        # A clustered target: the URLs the replicator is given for its nodes (the checks reach the
        # cluster through `target`, one of them, and the others it announces).
        self.target_urls = target_urls
        self.source, self.target = source, target
        # Replaced in open() by clients that reconnect within 0.25 s, so a measured time to recover
        # is the replicator's, not the test client's reconnect wait.
        self.source_nc, self.target_nc = source_nc, target_nc
        self.results = results
        self.source_proxy = ThreadedProxy(source.port).start()
        self.target_proxy = ThreadedProxy(target.port).start()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.publisher: ContinuousPublisher | None = None
        self.monitor = free_port()
        self.config_path = tmp / "sr.yaml"
        self.log = tmp / "worker.log"
        self.city: City | None = None

    # ---- set-up
    async def open(self) -> Rig:
        opts = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.25, "connect_timeout": 2}
        source_url = self.source.url.replace("://", f"://{self.userinfo}", 1)
        self.source_nc = await nats.connect(source_url, name="fault-check-source", **opts)
        self.target_nc = await nats.connect(self.target.url, name="fault-check-target", **opts)
        self._own = (self.source_nc, self.target_nc)
        return self

    async def add_city(self, server: LocalNatsServer) -> City:
        """A second source (same stream name, same subjects) that `stream`, `write_config`,
        `publish` and `finish` include from now on; `spawn(city=True)` runs its replicator."""
        nc = await nats.connect(server.url, name="fault-check-city2", max_reconnect_attempts=-1,
                                reconnect_time_wait=0.25, connect_timeout=2)
        self.city = City(server, ThreadedProxy(server.port).start(), nc, self.tmp / "sr-city2.yaml")
        return self.city

    async def stream(self, **kw: Any) -> None:
        await make_stream(self.source_nc, STREAM, **kw)
        if self.city is not None:
            await make_stream(self.city.nc, STREAM, **kw)

    async def target_for(self, path: str) -> None:
        """The target stream for a write path: `message`, created here without `allow_batched`;
        `batch`, left to the replicator, which creates it with `allow_batched`."""
        if path == "message":
            await make_stream(self.target_nc, STREAM)

    def write_config(self, **overrides: Any) -> Path:
        settings: dict[str, Any] = {"max_in_flight": 1000, "monitor": self.monitor, **overrides}
        source_url = self.source_proxy.url.replace("://", f"://{self.userinfo}", 1)
        target_url = self.target_urls or self.target_proxy.url
        config = topic_config(source_url, target_url, **settings)
        if self.city is not None:  # the same file but the URL (and no monitor port of its own)
            city = topic_config(self.city.proxy.url, target_url, **{**settings, "monitor": None})
            write_config(self.city.config_path, city)
        return write_config(self.config_path, config)

    def spawn(self, *extra: str, instance: str | None = None, log: Path | None = None,
              city: bool = False) -> subprocess.Popen[bytes]:
        config = self.city.config_path if city and self.city is not None else self.config_path
        default_log = self.tmp / "city2.log" if city else self.log
        proc = spawn(config, "fleet", *extra, instance=instance, log_path=log or default_log)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        stop(proc, kill=True)
        self.procs.remove(proc)

    def publish(self, rate: float = 400.0, **kw: Any) -> ContinuousPublisher:
        self.publisher = ContinuousPublisher(self.source_nc, rate=rate, **kw).start()
        if self.city is not None:
            self.city.publisher = ContinuousPublisher(self.city.nc, rate=rate, **kw).start()
        return self.publisher

    # ---- faults
    async def stop_server(self, server: LocalNatsServer, kill: bool = False) -> None:
        """In a thread: the publisher keeps running while the server goes down."""
        await asyncio.to_thread(server.stop, kill)

    async def start_server(self, server: LocalNatsServer) -> None:
        await asyncio.to_thread(server.start)

    # ---- measurements
    async def source_count(self, within: float = 20.0) -> int:
        """Messages on the source(s) now (waits out a restart)."""
        total = 0
        for nc in self._source_ncs():
            deadline = time.monotonic() + within
            while True:
                n = await stream_count(nc, STREAM)
                if n >= 0:
                    total += n
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("source stream unreachable")
                await asyncio.sleep(0.2)
        return total

    def _name(self) -> str:
        """The replicator name in the config (the writer id depends on it)."""
        return profile_for(yaml.safe_load(self.config_path.read_text())).base_name

    def _source_ncs(self) -> list[Client]:
        return [self.source_nc] + ([self.city.nc] if self.city is not None else [])

    async def time_to_catch_up(self, since: float, within: float = 60.0) -> float | None:
        """Seconds from `since` (the fault's end, time.monotonic()) until the target holds everything
        the source held when the fault ended and at least one message published after it. With a
        second city writing the same target, the count would include its copies: the primary's
        ordered consumer then tells instead (acknowledged only once its copies landed)."""
        if self.city is not None:
            want = await stream_count(self.source_nc, STREAM) + 1
            if await wait_acked(self.source_nc, STREAM, self._name(), want, within) is None:
                return None
            return time.monotonic() - since
        want = await self.source_count() + 1  # and one published after: the replicator is live again
        if await wait_count(self.target_nc, STREAM, want, within) is None:
            return None
        return time.monotonic() - since

    # ---- the final check
    async def finish(self, scenario: str, *, recover_s: float | None, ordered: bool = True, faults: int = 1,
                     notes: str = "", within: float = 90.0) -> Outcome:
        """Stop publishing, let the replicator catch up, stop it cleanly, compare the streams (each
        source with its own writer's copies when a second city fans in)."""
        publishers = [self.publisher] + ([self.city.publisher] if self.city is not None else [])
        for publisher in publishers:
            if publisher is not None:
                await publisher.stop()
        want = await self.source_count()
        caught_up = await wait_count(self.target_nc, STREAM, want, within)
        await asyncio.sleep(1.0)  # a late duplicate would land now
        codes = [stop(p) for p in list(self.procs)]
        self.procs.clear()
        target = await read_stream(self.target_nc, STREAM)
        outcomes = []
        for nc, publisher in zip(self._source_ncs(), publishers, strict=True):
            source = await read_stream(nc, STREAM)
            writer = await _writer(nc, self._name()) if self.city is not None else None
            outcomes.append(compare(scenario, source, target, recover_s=recover_s, faults=faults, notes=notes,
                                    writer=writer))
            if publisher is not None:
                indices = {int(m.headers["X-Index"]) for m in source if "X-Index" in m.headers}
                assert publisher.acked <= indices, "the source lost acknowledged messages (rig problem)"
        outcome = _combined(outcomes)
        self.results.append(outcome)
        print("FAULT-RESULT", " | ".join(outcome.row()))
        assert caught_up is not None, (
            f"{scenario}: target has {len(target)} of {want} messages after {within}s: {outcome}\n"
            f"{self.log_tail()}"
        )
        assert outcome.lost == 0, f"{scenario}: {outcome}\n{self.log_tail()}"
        assert outcome.mismatched == 0, f"{scenario}: copies differ from the source: {outcome}"
        if ordered:
            assert outcome.duplicated == 0 and outcome.out_of_order == 0, f"{scenario}: {outcome}"
        assert codes == [0] * len(codes), f"{scenario}: exit codes {codes} on SIGTERM\n{self.log_tail()}"
        return outcome

    def log_tail(self, lines: int = 40) -> str:
        logs = sorted(self.tmp.glob("*.log"))
        out = []
        for path in logs:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher._stop.set()
            if self.publisher._task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.publisher._task, 10)
        for proc in self.procs:
            with contextlib.suppress(Exception):
                stop(proc, kill=True)
        self.procs.clear()
        if self.city is not None:
            if self.city.publisher is not None:
                self.city.publisher._stop.set()
            self.city.proxy.stop()
            # Its server may be gone already (its fixture is torn down first): nats-py's close of a
            # reconnecting client can end in CancelledError.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.city.nc.close(), 5)
        self.source_proxy.stop()
        self.target_proxy.stop()
        for nc in getattr(self, "_own", ()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5)


async def copying(rig: Rig, path: str, upto: int, within: float = 30.0) -> None:
    """Wait until the worker, on the expected write path, has copied `upto` of the backlog."""
    assert await wait_metric(rig.monitor, "stream_replicator_write_path", 1.0, within, path=path), rig.log_tail()
    assert await wait_count(rig.target_nc, STREAM, upto, within) is not None, rig.log_tail()


async def _writer(nc: Client, name: str) -> str:
    created = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"")).data)["created"]
    return writer_id(STREAM, stream_identity(created), name)


def _combined(outcomes: list[Outcome]) -> Outcome:
    """One results row for all sources of a scenario."""
    first = outcomes[0]
    if len(outcomes) == 1:
        return first
    total = Outcome(first.scenario, sum(o.messages for o in outcomes), sum(o.copied for o in outcomes),
                    sum(o.lost for o in outcomes), sum(o.duplicated for o in outcomes),
                    sum(o.out_of_order for o in outcomes), sum(o.mismatched for o in outcomes), first.recover_s,
                    first.faults, first.notes)
    return total
