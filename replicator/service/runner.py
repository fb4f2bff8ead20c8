"""Runs one profile: connections per worker, streams, the copy loops, the monitor, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from nats.aio.client import Client

from replicator.config.model import Profile
from replicator.copier.control import Stopper
from replicator.copier.endpoints import Endpoints
from replicator.observe.metrics import Metrics, WorkerMetrics
from replicator.observe.monitor import MonitorServer
from replicator.service.sampling_plane import SamplingPlane
from replicator.transport.connections import ConnectError, connect, material_for
from replicator.transport.errors import NATS_ERRORS
from replicator.transport.streams import StreamSetupError, ensure_target_stream, find_source_stream
from replicator.transport.tasks import cancel_and_wait

if TYPE_CHECKING:  # each mode's loop is imported when a profile runs in that mode
    from replicator.copier.ordered import OrderedCopier
    from replicator.copier.scaled import ScaledWorker
    from replicator.sampling.election import LeaderElection

log = logging.getLogger(__name__)
T = TypeVar("T")

# How often rotated TLS and credentials files are looked for between reconnects (each reconnect looks too).
MATERIAL_CHECK_INTERVAL = 10.0


@dataclass
class WorkerState:
    name: str
    source: Client | None = None
    target: Client | None = None
    bound: bool = False
    standby: bool = False

    @property
    def ready(self) -> bool:
        connected = bool(self.source and self.source.is_connected and self.target and self.target.is_connected)
        return connected and (self.bound or self.standby)

    def ready_value(self) -> float:
        return 1.0 if self.ready else 0.0


@dataclass
class Replicator:
    """One topic profile in one process: `run()` until `stop()` (or SIGTERM/SIGINT via `install_signals`)."""

    profile: Profile
    metrics: Metrics = field(default_factory=Metrics)
    stopper: Stopper = field(default_factory=Stopper)
    monitor_port: int | None = None
    serve_monitor: bool = True  # False when the process serves one monitor for all its profiles

    def __post_init__(self) -> None:
        self.workers = [WorkerState(name) for name in self.profile.worker_names()]
        self.monitor: MonitorServer | None = None
        self.loops: list[OrderedCopier | ScaledWorker] = []
        self.sampling: SamplingPlane | None = None
        if self.monitor_port is None:
            self.monitor_port = self.profile.settings.monitor

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Every worker connected and bound (or a standby), and none stuck on an unclassified error."""
        detail = {w.name: ("ready" if w.ready else "not ready") for w in self.workers}
        stuck = {loop.ep.worker: loop.stuck.stuck for loop in self.loops if loop.stuck.stuck}
        ready = bool(self.workers) and all(w.ready for w in self.workers) and not stuck
        return ready, {"workers": detail, **({"stuck": stuck} if stuck else {})}

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    def stop(self) -> None:
        if not self.stopper.stopping and self.loops:  # still starting: nothing in flight to finish
            log.info("%s stopping: finishing in-flight messages", self.profile.profile)
        self.stopper.stop()
        for loop in self.loops:
            loop.stopper.stop()

    async def run(self) -> None:
        settings = self.profile.settings
        if settings.source_cluster_id or settings.target_cluster_id:
            log.warning("source_cluster_id/target_cluster_id are NATS Streaming settings: used only in "
                        "default names, otherwise ignored")
        if self.serve_monitor and self.monitor_port is not None:
            self.monitor = MonitorServer(self.metrics.registry, self.readiness, self.monitor_port)
            await self.monitor.start()
            log.info("monitor on port %d: /metrics /healthz /readyz", self.monitor.port)
        watcher = asyncio.create_task(self._watch_material(), name="material-watch")
        try:
            await self._run_workers()
        finally:
            await cancel_and_wait([watcher])
            for w in self.workers:
                for nc in (w.source, w.target):
                    if nc is not None and not nc.is_closed:
                        with contextlib.suppress(Exception):
                            # drain when connected; a connection still (re)connecting is just closed
                            await (nc.drain() if nc.is_connected else nc.close())
            if self.monitor is not None:
                await self.monitor.stop()

    async def _watch_material(self) -> None:
        """A rotated file is reloaded (or a bad one warned about) when it changes, not only at the
        next reconnect: logs, and the certificate gauges, tell what the next reconnect will use."""
        sources = {s for side in ("source", "target") if (s := material_for(self.profile, side))}  # type: ignore[arg-type]
        while sources and not self.stopper.stopping:
            await self.stopper.sleep(MATERIAL_CHECK_INTERVAL)
            for source in sources:
                source.check()

    async def _run_workers(self) -> None:
        name = self.profile.metrics_name
        worker_metrics = [self.metrics.worker(name, w.name) for w in self.workers]
        for w, m in zip(self.workers, worker_metrics, strict=True):
            m.ready.set_function(w.ready_value)
        try:
            for w, m in zip(self.workers, worker_metrics, strict=True):
                w.source = await connect(self.profile, "source", w.name, m, stopping=lambda: self.stopper.stopping)
                w.target = await connect(self.profile, "target", w.name, m, stopping=lambda: self.stopper.stopping)
                m.leader.set(1)
        except ConnectError:
            if self.stopper.stopping:  # a stop while still connecting is a clean stop
                return
            raise
        first = self.workers[0]
        assert first.source and first.target
        streams = await self._streams(first.source, first.target)
        if streams is None or self.stopper.stopping:
            return
        source_stream, target_stream = streams
        try:
            self.sampling = await SamplingPlane.create(self.profile, first.source, first.target, worker_metrics,
                                                       self.stopper)
        except ConnectError:
            if self.stopper.stopping:
                return
            raise
        try:
            if self.profile.settings.ordered:
                await self._run_ordered(first, worker_metrics[0], source_stream, target_stream)
            else:
                await self._run_scaled(worker_metrics, source_stream, target_stream)
        finally:
            await self.sampling.close()

    async def _streams(self, source: Client, target: Client) -> tuple[str, str] | None:
        """(source stream, target stream), retried until they are usable; None if stopped first
        (at once: a request to an unreachable server is abandoned, not waited out)."""
        delay = 0.5
        while not self.stopper.stopping:
            try:
                return await self._until_stopped(self._set_up_streams(source, target))
            except StreamSetupError as err:
                log.error("%s (retrying)", err)
            except asyncio.CancelledError:
                if not self.stopper.stopping:
                    raise
            except NATS_ERRORS as err:
                if not self.stopper.stopping:
                    log.warning("stream set-up failed: %s (retrying)", err)
            await self.stopper.sleep(delay)
            delay = min(delay * 2, 10.0)
        return None

    async def _set_up_streams(self, source: Client, target: Client) -> tuple[str, str]:
        from replicator.copier.loops import check_start

        source_stream = await find_source_stream(source.jetstream(), self.profile.settings)
        subjects = (await source.jetstream().stream_info(source_stream)).config.subjects or []
        await check_start(self.profile, source, target, source_stream, subjects)  # before a target is created
        target_stream = await ensure_target_stream(source.jetstream(), target.jetstream(), self.profile.settings,
                                                   source_stream)
        return source_stream, target_stream

    async def _until_stopped(self, work: Coroutine[Any, Any, T]) -> T | None:
        """`work`'s result, or None as soon as a stop is requested (the work is cancelled)."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self.stopper.event.wait())
        try:
            await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return None
        return task.result()

    def _endpoints(self, w: WorkerState, m: WorkerMetrics, source_stream: str, target_stream: str) -> Endpoints:
        assert w.source and w.target

        def ready(flag: bool) -> None:
            w.bound = flag

        limiter = self.sampling.limiter_for(m) if self.sampling else None
        return Endpoints(self.profile, w.source, w.target, source_stream, target_stream, w.name, m,
                         limiter=limiter, ready=ready)

    async def _run_ordered(self, w: WorkerState, m: WorkerMetrics, source_stream: str, target_stream: str) -> None:
        """Copy while leader (always, without election); a standby waits and takes over.

        On losing the lease the copier is cancelled, not drained: a standby may take over a quarter
        TTL later and must find no old leader still publishing. What was in flight either landed
        (and the new leader resumes after it) or fails the new leader's chain check.
        """
        from replicator.copier.ordered import OrderedCopier

        assert self.sampling is not None
        election = self.sampling.copy_election
        if election is None:
            copier = OrderedCopier(self._endpoints(w, m, source_stream, target_stream), stopper=self.stopper)
            self.loops = [copier]
            await copier.run()
            return
        while not self.stopper.stopping:
            w.standby = True
            m.leader.set(0)
            await self._until_leader(election)
            if self.stopper.stopping:
                break
            w.standby = False
            log.info("%s is the leader: copying", w.name)
            copier = OrderedCopier(self._endpoints(w, m, source_stream, target_stream))
            self.loops = [copier]
            if self.stopper.stopping:
                copier.stopper.stop()
            run = asyncio.ensure_future(copier.run())
            lost = asyncio.ensure_future(election.wait_lost())
            await asyncio.wait([lost, run], return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                log.warning("%s lost leadership: stopping the copier at once", w.name)
                await cancel_and_wait([run])
            lost.cancel()
            if not run.cancelled():
                run.result()

    async def _until_leader(self, election: LeaderElection) -> None:
        leader = asyncio.ensure_future(election.wait_leader())
        stopping = asyncio.ensure_future(self.stopper.event.wait())
        await asyncio.wait([leader, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in (leader, stopping):
            task.cancel()

    async def _run_scaled(self, metrics: list[WorkerMetrics], source_stream: str, target_stream: str) -> None:
        from replicator.copier.scaled import GroupState, ScaledWorker

        group = GroupState()  # the group's durable: created by one worker at a time, its floor read by one
        self.loops = [
            ScaledWorker(self._endpoints(w, m, source_stream, target_stream), stopper=self.stopper, group=group)
            for w, m in zip(self.workers, metrics, strict=True)
        ]
        await asyncio.gather(*(loop.run() for loop in self.loops))
